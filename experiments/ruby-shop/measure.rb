# The sidecar beside what a Ruby user would pick instead, side by side in one
# run: three Puma clusters (WORKERS workers each, preloaded, puma_worker_killer
# recycling one every RECYCLE seconds) serve the same Rack app under the same
# paced load, each scraped once a second in turn, for SECS seconds:
#
#   sidecar      client_ruby 5.x DirectFileStore, served by promlab's sidecar
#                (started by the Puma plugin, --fold-exited every FOLD seconds)
#   client_ruby  the same store served by client_ruby's own Rack exporter
#   client-mmap  prometheus-client-mmap 0.16.2 (Debian) and its Rack exporter
#
# Per scrape: wall time at the scraper, the exporter's CPU time (the Ruby
# exporters' thread CPU, from a response header; the sidecar's CPU over all
# its threads during the request, from /proc/PID/task/*/schedstat), the bytes,
# the store's files; per arm the memory (the sidecar's RSS; master and workers'
# RSS) and whether the final values are the requests answered, exactly.
#
#   ruby experiments/ruby-shop/measure.rb [--secs 90] [--rate 30] [--recycle 2]
#        [--workers 4] [--fold 10] [--promlab target/release/promlab] [--out DIR]
#
# Writes DIR (default experiments/ruby-shop/results/<UTC time>-<host>/):
# scrapes.csv, summary.csv, machine.txt, README.md, each arm's Puma log and
# the sidecar's own /metrics/promlab at the end (sidecar-self.prom). Needs Debian's puma,
# ruby-puma-worker-killer, ruby-prometheus-client-mmap, and client_ruby's
# sources (the workplace's shared/upstream, or PROMLAB_SHARED).
require 'csv'
require 'etc'
require 'fileutils'
require 'net/http'
require 'optparse'
require 'socket'
require 'tmpdir'

ROOT = File.expand_path('../..', __dir__)
opts = { secs: 90, rate: 30, recycle: 2.0, workers: 4, fold: 10,
         promlab: File.join(ROOT, 'target/release/promlab'), out: nil }
OptionParser.new do |o|
  o.on('--secs N', Integer) { |v| opts[:secs] = v }
  o.on('--rate N', Integer, 'requests per second per arm') { |v| opts[:rate] = v }
  o.on('--recycle SECS', Float) { |v| opts[:recycle] = v }
  o.on('--workers N', Integer) { |v| opts[:workers] = v }
  o.on('--fold SECS', Integer) { |v| opts[:fold] = v }
  o.on('--promlab PATH') { |v| opts[:promlab] = File.expand_path(v) }
  o.on('--out DIR') { |v| opts[:out] = File.expand_path(v) }
end.parse!
abort "no promlab binary at #{opts[:promlab]} (cargo build --release)" unless File.executable?(opts[:promlab])

shared = [ENV['PROMLAB_SHARED'], File.join(ROOT, '../shared')].compact
                                                                .find { |d| File.file?(File.join(d, 'upstream/client_ruby-5.x-uri.tar.gz')) }
abort 'client_ruby sources not found (PROMLAB_SHARED)' unless shared
tmp = Dir.mktmpdir('ruby-shop')
system('tar', 'xzf', File.join(shared, 'upstream/client_ruby-5.x-uri.tar.gz'), '-C', tmp, exception: true)
client_ruby = File.join(tmp, 'client_ruby-5.x-uri/lib')

def free_port
  s = TCPServer.new('127.0.0.1', 0)
  s.addr[1]
ensure
  s&.close
end

Arm = Struct.new(:name, :port, :scrape_port, :store, :pid, :log, :answered, :failed, keyword_init: true)
app_ru = File.join(ROOT, 'experiments/lab/tests/support/puma_app/config.ru')
arms = [
  ['sidecar', app_ru, true], ['client_ruby', app_ru, false],
  ['client-mmap', File.join(__dir__, 'config_mmap.ru'), false]
].map do |name, ru, sidecar|
  store = File.join(tmp, name)
  FileUtils.mkdir_p(store)
  port = free_port
  scrape_port = sidecar ? free_port : port
  env = {
    'PUMA_PORT' => port.to_s, 'PUMA_WORKERS' => opts[:workers].to_s,
    'PUMA_RECYCLE_SECS' => opts[:recycle].to_s, 'APP_RU' => ru, 'PROMLAB_STORE' => store,
    'PROMLAB_SIDECAR' => sidecar ? '1' : '0', 'PROMLAB_LISTEN' => "127.0.0.1:#{scrape_port}",
    'PROMLAB_BIN' => opts[:promlab], 'PROMLAB_FOLD_EVERY' => opts[:fold].to_s,
    # client-mmap comes from Ruby's vendor path: client_ruby must not shadow it.
    'RUBYLIB' => name == 'client-mmap' ? File.join(ROOT, 'ruby/lib') : "#{client_ruby}:#{File.join(ROOT, 'ruby/lib')}"
  }
  log = File.join(tmp, "#{name}.log")
  pid = Process.spawn(env, 'puma', '-C', File.join(ROOT, 'experiments/lab/tests/support/puma_app/puma.rb'), out: log, err: %i[child out], pgroup: true)
  Arm.new(name: name, port: port, scrape_port: scrape_port, store: store, pid: pid, log: log,
          answered: 0, failed: 0)
end

def get(port, path, timeout: 30)
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  response = Net::HTTP.start('127.0.0.1', port, open_timeout: 5, read_timeout: timeout) do |http|
    http.get(path, 'Accept-Encoding' => 'identity')
  end
  [response, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
end

def wait_until(what, secs)
  deadline = Time.now + secs
  until yield
    raise "#{what}: not within #{secs} s" if Time.now > deadline

    sleep 0.2
  end
end

def sidecar_pid(arm)
  Integer(File.read(File.join(arm.store, '.promlab-serve.pid')).strip)
end

# CPU seconds over every thread of a process (scheduler statistics, ns).
def cpu_seconds(pid)
  Dir.glob("/proc/#{pid}/task/*/schedstat").sum { |f| File.read(f).split.first.to_i } / 1e9
rescue Errno::ENOENT
  0.0
end

def rss_mib(pid)
  File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+)/, 1].to_i / 1024.0
rescue Errno::ENOENT
  0.0
end

# The master and its workers (its children), in MiB.
def puma_rss_mib(master)
  children = Dir.glob('/proc/[0-9]*/stat').filter_map do |f|
    fields = File.read(f).split(') ').last.split
    File.basename(File.dirname(f)).to_i if fields[1].to_i == master
  rescue Errno::ENOENT, Errno::ESRCH
    nil
  end
  workers = children.reject { |pid| File.read("/proc/#{pid}/cmdline").include?('promlab') rescue true }
  ([master] + workers).sum { |pid| rss_mib(pid) }
end

def store_files(arm)
  Dir.glob(File.join(arm.store, '*.{bin,db}')).size
end

begin
  arms.each do |arm|
    wait_until("#{arm.name} /metrics", 60) do
      get(arm.scrape_port, '/metrics', timeout: 5).first.code == '200'
    rescue SystemCallError, Net::ReadTimeout, Net::OpenTimeout
      false
    end
  end
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  stop_at = started + opts[:secs]
  loaders = arms.map do |arm|
    Thread.new do
      i = 0
      loop do
        at = started + i.to_f / opts[:rate]
        break if at >= stop_at

        pause = at - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        sleep pause if pause.positive?
        i += 1
        begin
          response, = get(arm.port, "/#{%w[a b/c d][i % 3]}?n=#{i}", timeout: 30)
          response.code == '200' ? arm.answered += 1 : arm.failed += 1
        rescue StandardError
          arm.failed += 1
        end
      end
    end
  end

  rows = []
  sidecar_arm = arms.first
  sidecar_cpu_start = cpu_seconds(sidecar_pid(sidecar_arm))
  round = 0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < stop_at
    tick = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    arms.rotate(round).each do |arm|
      before = arm == sidecar_arm ? cpu_seconds(sidecar_pid(arm)) : nil
      response, wall = begin
        get(arm.scrape_port, '/metrics')
      rescue StandardError => e
        [nil, nil, e]
      end
      cpu = if before
              cpu_seconds(sidecar_pid(arm)) - before
            else
              response&.[]('x-exporter-cpu-seconds')&.to_f
            end
      rows << [arm.name, round, response&.code || 'error', wall && (wall * 1000).round(3),
               cpu && (cpu * 1000).round(3), response&.body&.bytesize,
               store_files(arm), arm.name == 'sidecar' ? rss_mib(sidecar_pid(arm)).round(1) : nil,
               puma_rss_mib(arm.pid).round(1)]
    end
    round += 1
    pause = tick + 1 - Process.clock_gettime(Process::CLOCK_MONOTONIC)
    sleep pause if pause.positive?
  end
  loaders.each(&:join)
  sidecar_cpu_total = cpu_seconds(sidecar_pid(sidecar_arm)) - sidecar_cpu_start
  sleep 3

  # Verify what was timed: each arm's final count is the requests it answered.
  finals = arms.to_h do |arm|
    body = get(arm.scrape_port, '/metrics').first.body
    total = body.lines.grep(/\Aapp_requests_total\{/).sum { |l| l.split.last.to_f }
    [arm.name, total]
  end

  own = get(sidecar_arm.scrape_port, '/metrics/promlab').first.body
  folded = own[/^promlab_fold_files_folded_total (\S+)/, 1].to_f.to_i
  fold_runs = own[/^promlab_fold_runs_total\{result="ok"\} (\S+)/, 1].to_f.to_i

  stamp = Time.now.utc.strftime('%Y%m%dT%H%M%SZ')
  out = opts[:out] || File.join(__dir__, 'results', "#{stamp}-#{Socket.gethostname}")
  FileUtils.mkdir_p(out)
  header = %w[arm round status wall_ms exporter_cpu_ms bytes store_files sidecar_rss_mib puma_rss_mib]
  CSV.open(File.join(out, 'scrapes.csv'), 'w') do |csv|
    csv << header
    rows.each { |r| csv << r }
  end
  median = ->(xs) { xs = xs.compact.sort; xs.empty? ? nil : xs[xs.size / 2] }
  p90 = ->(xs) { xs = xs.compact.sort; xs.empty? ? nil : xs[(xs.size * 0.9).floor.clamp(0, xs.size - 1)] }
  summary_header = %w[arm scrapes failed_scrapes wall_ms_median wall_ms_p90 exporter_cpu_ms_median
                      exporter_cpu_ms_mean bytes_last store_files_last sidecar_rss_mib_max
                      puma_rss_mib_median requests_answered requests_failed final_count exact
                      fold_runs files_folded]
  summary = arms.map do |arm|
    mine = rows.select { |r| r[0] == arm.name }
    ok = mine.select { |r| r[2] == '200' }
    cpus = ok.map { |r| r[4] }.compact
    mean_cpu = if arm.name == 'sidecar'
                 (sidecar_cpu_total * 1000 / ok.size).round(3) # every thread, folds included
               else
                 (cpus.sum / cpus.size).round(3)
               end
    [arm.name, ok.size, mine.size - ok.size, median.(ok.map { |r| r[3] }), p90.(ok.map { |r| r[3] }),
     median.(cpus), mean_cpu, ok.last&.[](5), ok.last&.[](6),
     ok.map { |r| r[7] }.compact.max, median.(ok.map { |r| r[8] }), arm.answered, arm.failed,
     finals[arm.name], finals[arm.name] == arm.answered,
     arm == sidecar_arm ? fold_runs : nil, arm == sidecar_arm ? folded : nil]
  end
  CSV.open(File.join(out, 'summary.csv'), 'w') do |csv|
    csv << summary_header
    summary.each { |r| csv << r }
  end
  versions = {
    'ruby' => RUBY_DESCRIPTION,
    'puma' => `dpkg-query -W -f='${Version}' puma`.strip,
    'puma_worker_killer' => `dpkg-query -W -f='${Version}' ruby-puma-worker-killer`.strip,
    'prometheus-client-mmap' => `dpkg-query -W -f='${Version}' ruby-prometheus-client-mmap`.strip,
    'client_ruby' => '5.x-uri (shared/upstream/client_ruby-5.x-uri.tar.gz)',
    'promlab revision' => `git -C #{ROOT} rev-parse --short HEAD`.strip
  }
  File.write(File.join(out, 'machine.txt'), <<~TEXT)
    date: #{stamp}
    host: #{Socket.gethostname}
    kernel: #{`uname -sr`.strip}
    cpu: #{File.read('/proc/cpuinfo')[/^model name\s*:\s*(.*)$/, 1]} x #{Etc.nprocessors}
    memory: #{File.read('/proc/meminfo')[/^MemTotal:\s*(.*)$/, 1]}
    load average at the end: #{File.read('/proc/loadavg').split[0, 3].join(' ')}
    #{versions.map { |k, v| "#{k}: #{v}" }.join("\n")}
  TEXT
  args = ARGV.empty? ? '' : ''
  File.write(File.join(out, 'README.md'), <<~TEXT)
    # The sidecar beside client_ruby's and prometheus-client-mmap's exporters

    ```sh
    ruby experiments/ruby-shop/measure.rb --secs #{opts[:secs]} --rate #{opts[:rate]} --recycle #{opts[:recycle]} --workers #{opts[:workers]} --fold #{opts[:fold]}#{args}
    ```

    Three Puma clusters (#{opts[:workers]} workers each, preloaded, puma_worker_killer recycling
    one every #{opts[:recycle]} s) served the same app under the same paced load (#{opts[:rate]}
    requests/s each, a connection per request) for #{opts[:secs]} s, each scraped once a second in
    turn (a connection per scrape, no gzip). `scrapes.csv` has every scrape; `summary.csv` the
    medians. `exporter_cpu_ms`: for the Ruby exporters the CPU time of the worker thread that
    served /metrics; for the sidecar the CPU of all its threads during the request (median), and
    its whole process's CPU over the run divided by its scrapes (mean: folds included).
    `puma_rss_mib`: the master and workers (the sidecar's own RSS is apart). `exact`: the final
    scrape's `app_requests_total` equals the requests answered.

    #{summary_header.join(' | ')}
    #{summary_header.map { '---' }.join(' | ')}
    #{summary.map { |r| r.join(' | ') }.join("\n")}
  TEXT
  File.write(File.join(out, 'sidecar-self.prom'), own)
  arms.each { |arm| FileUtils.cp(arm.log, File.join(out, "#{arm.name}.log")) }
  puts File.read(File.join(out, 'README.md'))
  puts "results: #{out}"
ensure
  arms.each do |arm|
    Process.kill('TERM', arm.pid)
  rescue Errno::ESRCH
    nil
  end
  arms.each do |arm|
    Process.wait(arm.pid)
  rescue Errno::ECHILD
    nil
  end
  FileUtils.rm_rf(tmp)
end
