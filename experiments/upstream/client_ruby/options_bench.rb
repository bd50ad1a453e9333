# client_ruby#143's options side by side, in Ruby, on the same workloads (options.rb does
# each step with the option's own client_ruby):
#
#   v4.2.5          client_ruby 4.2.5, one file per metric and process
#   list-once       4.2.5 + 07-list-once
#   list-once-fold  4.2.5 + 07-list-once + 08-fold-exited (folded after every recycle)
#   poc             the maintainers' branch poc_file_per_process: one file per process
#   poc-fold        poc + poc-file-per-process/01-fold-exited
#
#   ruby experiments/upstream/client_ruby/options_bench.rb [--out DIR] [--hours H]
#       [--workers W] [--samples 1,24,72,120,168] [--many-metrics full|quick] [--only PARTS]
#       [--keep-churn DIR] [--quiet-wait SECS]
#
# PARTS (comma-separated, default all): rspec, write, fixed (many-metrics and the seed repro),
# churn, compat (untimed: a directory mixing the layouts, an older release's store, folded
# stores read by the unpatched exporter, a registered metric with no series). The churn: W
# workers (default 200) recycled every simulated hour for H hours (default 168, a week); after
# every recycle the fold arms fold; at each sample hour every option exports its store once.
# Every export is compared byte for byte: fixed stores with their expected.prom, churn exports
# with v4.2.5's (whose counter lines are checked against the workload's own totals).
# --keep-churn keeps the churn's last stores and v4.2.5's last exposition (hard links) for
# options_sidecar.sh. Timed steps run inside the QUIET protocol when PROMLAB_QUIET names the
# lock file (PROMLAB_QUIET_NAME: who holds it; PROMLAB_QUIET_MAX_WAIT: seconds a timed step waits
# for its window at most, then runs without one and logs so); untimed work waits for others'
# windows --quiet-wait seconds at most over the whole run (default 600). Needs ruby, rspec, patch, tar, du, and
# target/release/promlab (for the many-metrics store).
require 'fileutils'
require 'optparse'
require 'open3'
require 'csv'
require 'tmpdir'

HERE = __dir__
ROOT = File.expand_path("../../..", HERE)
OPTIONS_RB = File.join(HERE, "options.rb")
SHARED = ENV["PROMLAB_SHARED"] || [File.join(ROOT, "../shared"), File.join(ROOT, "../../shared")]
                                  .find { |d| File.directory?(d) } || File.join(ROOT, "../shared")

opts = { hours: 168, workers: 200, samples: [1, 24, 72, 120, 168], many: "full",
         only: %w[rspec write fixed churn compat], out: nil }
OptionParser.new do |o|
  o.on("--out DIR") { |v| opts[:out] = v }
  o.on("--hours N", Integer) { |v| opts[:hours] = v }
  o.on("--workers N", Integer) { |v| opts[:workers] = v }
  o.on("--samples LIST") { |v| opts[:samples] = v.split(",").map { |s| Integer(s) } }
  o.on("--many-metrics SIZE") { |v| opts[:many] = v }
  o.on("--only PARTS") { |v| opts[:only] = v.split(",") }
  o.on("--keep-churn DIR") { |v| opts[:keep] = v }
  o.on("--quiet-wait SECS", Integer) { |v| opts[:quiet_wait] = v }
end.parse!
$quiet_wait_left = Float(opts[:quiet_wait]) if opts[:quiet_wait]
opts[:samples] = opts[:samples].select { |h| h <= opts[:hours] }
out = opts[:out] || File.join(ROOT, "experiments/upstream/results",
                              "#{Time.now.utc.strftime('%Y-%m-%dT%H%M%SZ')}-#{`hostname`.strip}-options")
abort "options_bench: #{out} exists" if File.exist?(out)
FileUtils.mkdir_p(out)
OUT = File.expand_path(out)
TMP = Dir.mktmpdir("promlab-options-")
at_exit { FileUtils.rm_rf(TMP) }
LOG = File.open(File.join(OUT, "log.txt"), "a")

def log(msg)
  line = "[#{Time.now.utc.strftime('%H:%M:%S')}] #{msg}"
  puts line
  LOG.puts line
  LOG.flush
end

def sh!(*cmd, **kw)
  system(*cmd, exception: true, **kw)
end

# ------------------------------------------------------------------------------ QUIET
QUIET = ENV["PROMLAB_QUIET"]
QUIET_NAME = ENV["PROMLAB_QUIET_NAME"] || "options_bench"

def quiet_holder
  QUIET && File.exist?(QUIET) ? File.read(QUIET).strip : nil
end

# Before heavy work: wait while someone else measures, 10 minutes at most over the whole run
# (then the untimed work goes on; timed steps still wait for their own window).
$quiet_wait_left ||= 600.0  # unless --quiet-wait set it above
def wait_not_quiet
  while (h = quiet_holder) && h != QUIET_NAME && $quiet_wait_left > 0
    sleep 20
    $quiet_wait_left -= 20
  end
end

# A timed step waits for its window PROMLAB_QUIET_MAX_WAIT seconds at most (default: for ever);
# past that it runs without one, and the log says who held the lock.
QUIET_MAX_WAIT = ENV["PROMLAB_QUIET_MAX_WAIT"] ? Float(ENV["PROMLAB_QUIET_MAX_WAIT"]) : Float::INFINITY

def quiet
  return yield unless QUIET
  waited = 0
  while (h = quiet_holder) && h != QUIET_NAME && waited < QUIET_MAX_WAIT
    sleep 30
    waited += 30
  end
  other = quiet_holder if quiet_holder && quiet_holder != QUIET_NAME
  File.write(QUIET, "#{QUIET_NAME}\n") unless other
  started = Time.now
  begin
    yield
  ensure
    File.delete(QUIET) if quiet_holder == QUIET_NAME
    what = other ? "NO quiet window (#{other} held the lock after #{waited} s of waiting)" : "quiet window"
    log(format("%s %.0f s, load %s", what, Time.now - started, File.read("/proc/loadavg").split.first(3).join(" ")))
  end
end

# ------------------------------------------------------------------------------ arms
ARMS = {
  "v4.2.5" => ["v4.2.5", []],
  "list-once" => ["v4.2.5", ["v4.2.5/07-list-once"]],
  "list-once-fold" => ["v4.2.5", ["v4.2.5/07-list-once", "v4.2.5/08-fold-exited"]],
  "poc" => ["poc-file-per-process", []],
  "poc-fold" => ["poc-file-per-process", ["poc-file-per-process/01-fold-exited"]],
}.freeze
SOURCES = { "v4.2.5" => "client_ruby-v4.2.5.tar.gz",
            "poc-file-per-process" => "client_ruby-poc-file-per-process.tar.gz" }.freeze

def lib(arm)
  File.join(TMP, "arms", arm, "lib")
end

ARMS.each do |arm, (src, patches)|
  d = File.join(TMP, "arms", arm)
  FileUtils.mkdir_p(d)
  sh!("tar", "xzf", File.join(SHARED, "upstream", SOURCES.fetch(src)), "-C", d, "--strip-components=1")
  patches.each do |p|
    sh!("patch", "-s", "-p1", "-d", d, "--no-backup-if-mismatch", in: File.join(HERE, "patches", "#{p}.patch"))
  end
end

def ruby_in(arm, *args)
  o, e, st = Open3.capture3("ruby", "-I", lib(arm), OPTIONS_RB, *args)
  raise "options.rb #{args.first} (#{arm}) failed: #{e}" unless st.success?
  o
end

File.write(File.join(OUT, "machine.txt"), <<~TXT)
  date: #{Time.now.utc.strftime('%Y-%m-%dT%H:%M:%SZ')}
  uname: #{`uname -a`.strip}
  nproc: #{`nproc`.strip}
  cpu: #{File.read('/proc/cpuinfo')[/model name\s*:\s*(.*)/, 1]}
  memory: #{File.read('/proc/meminfo')[/MemTotal:\s*(.*)/, 1]}
  ruby: #{`ruby -v`.strip}
  rspec: #{`rspec --version 2>/dev/null`.split("\n").first}
  promlab revision: #{`git -C #{ROOT} rev-parse --short HEAD`.strip}#{system("git", "-C", ROOT, "diff", "--quiet") ? "" : "-dirty"}
  command: ruby experiments/upstream/client_ruby/options_bench.rb #{ARGV.join(' ')} (options: #{opts.reject { |k, _| k == :out }})
  sources: #{SOURCES.values.map { |s| File.join(SHARED, 'upstream', s) }.join(', ')}
  load at start: #{File.read('/proc/loadavg').strip}
TXT

# ------------------------------------------------------------------------------ rspec
if opts[:only].include?("rspec")
  CSV.open(File.join(OUT, "rspec.csv"), "w") do |csv|
    csv << %w[arm examples failures seconds]
    ARMS.each_key do |arm|
      wait_not_quiet
      t0 = Time.now
      o, = Open3.capture2e("rspec", chdir: File.join(TMP, "arms", arm))
      File.write(File.join(OUT, "rspec-#{arm}.log"), o)
      examples, failures = o.scan(/(\d+) examples?, (\d+) failures?/).last
      csv << [arm, examples, failures, (Time.now - t0).round(1)]
      log("rspec #{arm}: #{examples} examples, #{failures} failures")
      abort "options_bench: rspec failed for #{arm}" unless failures == "0"
    end
  end
end

# ------------------------------------------------------------------------------ write path
WRITE_TASKS = [["inc", 1, 50_000], ["inc", 4, 12_500], ["observe", 1, 10_000], ["observe", 4, 2_500]].freeze
if opts[:only].include?("write")
  CSV.open(File.join(OUT, "write.csv"), "w") do |csv|
    csv << %w[task threads arm round wall_ns cpu_ns ops]
    quiet do
      3.times do |round|
        arms = ARMS.keys.rotate(round)
        WRITE_TASKS.each do |kind, threads, steps|
          arms.each do |arm|
            d = Dir.mktmpdir("w", TMP)
            wall, cpu, n = ruby_in(arm, "write", kind, threads.to_s, steps.to_s, d).split.map(&:to_i)
            FileUtils.rm_rf(d)
            csv << [kind, threads, arm, round + 1, wall, cpu, n]
          end
        end
      end
    end
  end
  log("write path done")
end

# ------------------------------------------------------------------------------ exports
EXPORT_CSV = CSV.open(File.join(OUT, "export.csv"), "w")
EXPORT_CSV << %w[workload point arm files apparent_bytes disk_bytes wall_ns cpu_ns lines peak_rss_kb rss_before_kb reference result]
FOLD_CSV = CSV.open(File.join(OUT, "fold.csv"), "w")
FOLD_CSV << %w[workload point arm cpu_ns wall_ns files_folded files_after]

def store_files(dir)
  Dir.children(dir).count { |f| f.end_with?(".bin") }
end

def du(dir, apparent)
  `du -s --block-size=1 #{apparent ? '--apparent-size' : ''} #{dir}`.split.first.to_i
end

# One export of `root`/store by `arm`, compared with `reference`; returns the exposition's path.
def export(workload, point, arm, root, reps, reference, refname)
  got = File.join(TMP, "#{workload}-#{point}-#{arm}.prom")
  store = File.join(root, "store")
  wall, cpu, lines, rss, before = ruby_in(arm, "export", store, File.join(root, "registry.json"), reps.to_s, got).split.map(&:to_i)
  reference ||= got
  result = File.binread(got) == File.binread(reference) ? "identical" : "DIFFERENT"
  EXPORT_CSV << [workload, point, arm, store_files(store), du(store, true), du(store, false), wall, cpu, lines, rss,
                 before, refname, result]
  EXPORT_CSV.flush
  log("#{workload} #{point} #{arm}: #{store_files(store)} files, #{(cpu / 1e6).round(1)} ms CPU, #{result}")
  abort "options_bench: #{arm} exports #{workload} #{point} DIFFERENTLY (#{got} vs #{reference})" if result != "identical"
  got
end

def fold(workload, point, arm, root)
  store = File.join(root, "store")
  cpu, wall, folded = ruby_in(arm, "fold", store, File.join(root, "registry.json")).split.map(&:to_i)
  FOLD_CSV << [workload, point, arm, cpu, wall, folded, store_files(store)]
  FOLD_CSV.flush
  [cpu, folded]
end

# Stores of one file per metric and process (fixture or scenario) in each layout:
# file-per-metric (v4.2.5, list-once), folded (list-once-fold), replayed by the PoC (poc),
# replayed and folded (poc-fold). No process writes them: the fold arms fold everything.
def prepare_fixed(name, src_root)
  base = File.join(TMP, "fixed", name)
  roots = {}
  %w[per-metric per-metric-folded poc poc-folded].each do |layout|
    r = File.join(base, layout)
    FileUtils.mkdir_p(File.join(r, "store"))
    FileUtils.cp(File.join(src_root, "registry.json"), r)
    roots[layout] = r
  end
  sh!("cp", "-a", "#{src_root}/store/.", File.join(roots["per-metric"], "store"))
  sh!("cp", "-a", "#{src_root}/store/.", File.join(roots["per-metric-folded"], "store"))
  %w[poc poc-folded].each do |l|
    ruby_in("poc", "replay", File.join(src_root, "store"), File.join(src_root, "registry.json"), File.join(roots[l], "store"))
  end
  fold(name, "prepare", "list-once-fold", roots["per-metric-folded"])
  fold(name, "prepare", "poc-fold", roots["poc-folded"])
  roots
end

FIXED_ARMS = { "v4.2.5" => "per-metric", "list-once" => "per-metric", "list-once-fold" => "per-metric-folded",
               "poc" => "poc", "poc-fold" => "poc-folded" }.freeze
if opts[:only].include?("fixed")
  wait_not_quiet
  promlab = File.join(ROOT, "target/release/promlab")
  mm = File.join(TMP, "many-metrics-src")
  sh!(promlab, "scenario-store", "many-metrics", *(opts[:many] == "quick" ? ["--quick"] : []), "--out", mm,
      err: File.join(OUT, "scenario-store.log"))
  fixed = { "many-metrics" => [mm, 1],
            "seed-repro" => [File.join(SHARED, "fixtures/ruby-dfs/seed-repro-v4.2.5"), 3] }
  fixed.each do |name, (src, reps)|
    wait_not_quiet
    roots = prepare_fixed(name, src)
    log("#{name}: stores ready")
    quiet do
      FIXED_ARMS.each do |arm, layout|
        export(name, "-", arm, roots[layout], reps, File.join(src, "expected.prom"), "expected.prom")
      end
    end
  end
end

# ------------------------------------------------------------------------------ churn
CHURN_STORES = { "per-metric" => "v4.2.5", "per-metric-folded" => "list-once-fold",
                 "poc" => "poc", "poc-folded" => "poc-fold" }.freeze  # store => the arm that writes it
CHURN_ARMS = FIXED_ARMS
if opts[:only].include?("churn")
  base = File.join(TMP, "churn")
  roots = CHURN_STORES.keys.to_h do |s|
    r = File.join(base, s)
    FileUtils.mkdir_p(File.join(r, "store"))
    ruby_in("v4.2.5", "churn-registry", File.join(r, "registry.json"))
    [s, r]
  end
  live = {}
  fold_cpu = Hash.new(0)
  fold_log = CSV.open(File.join(OUT, "fold-hourly.csv"), "w")
  fold_log << %w[hour arm cpu_ns files_folded]
  opts[:hours].times do |hour|
    wait_not_quiet
    # The hour's workers start (each store written by its option's own client)...
    started = CHURN_STORES.to_h do |s, arm|
      stdin, stdout, th = Open3.popen2("ruby", "-I", lib(arm), OPTIONS_RB, "write-hour",
                                       File.join(roots[s], "store"), hour.to_s, opts[:workers].to_s)
      [s, [stdin, stdout, th]]
    end
    started.each { |s, (_, stdout, th)| raise "write-hour #{s} #{hour} failed" unless stdout.gets == "ready\n" }
    # ...the previous hour's exit...
    live.each_value do |stdin, _, th|
      stdin.close
      raise "a worker set failed" unless th.value.success?
    end
    live = started
    # ...and the fold arms fold what exited.
    %w[per-metric-folded poc-folded].each do |s|
      arm = CHURN_STORES[s]
      cpu, folded = fold("churn", "hour #{hour + 1}", arm, roots[s])
      fold_cpu[arm] += cpu
      fold_log << [hour + 1, arm, cpu, folded]
    end
    fold_log.flush
    next unless opts[:samples].include?(hour + 1)

    point = "hour #{hour + 1}"
    expected = ruby_in("v4.2.5", "churn-expected", (hour + 1).to_s, opts[:workers].to_s).lines.map(&:chomp)
    quiet do
      ref = nil
      CHURN_ARMS.each do |arm, s|
        got = export("churn", point, arm, roots[s], 1, ref, "v4.2.5")
        next if ref

        ref = got
        missing = expected - File.readlines(ref, chomp: true)
        abort "options_bench: v4.2.5's churn export lacks #{missing.first}" unless missing.empty?
      end
      # A fold that finds nothing new (the other 59 of the hour, folding every 60 s).
      %w[per-metric-folded poc-folded].each { |s| fold("churn", "#{point} again", CHURN_STORES[s], roots[s]) }
    end
    log("churn #{point}: fold CPU so far #{fold_cpu.transform_values { |v| (v / 1e9).round(2) }} s")
  end
  live.each_value do |stdin, _, th|
    stdin.close
    th.value
  end
  fold_log.close
  if opts[:keep]
    FileUtils.mkdir_p(opts[:keep])
    sh!("cp", "-al", base, opts[:keep])
    FileUtils.cp(File.join(TMP, "churn-hour #{opts[:hours]}-v4.2.5.prom"), File.join(opts[:keep], "reference.prom"))
  end
end
# ------------------------------------------------------------------------------ compat
if opts[:only].include?("compat")
  wait_not_quiet
  base = File.join(TMP, "compat")
  reg = File.join(base, "registry.json")
  FileUtils.mkdir_p(base)
  ruby_in("v4.2.5", "churn-registry", reg)
  # A store (root/store, root/registry.json) of hours written by the given arms, one
  # arm per hour, 5 workers each, all exited.
  store = lambda do |name, writers|
    root = File.join(base, name)
    FileUtils.mkdir_p(File.join(root, "store"))
    FileUtils.cp(reg, root)
    writers.each_with_index do |arm, hour|
      o, e, st = Open3.capture3("ruby", "-I", lib(arm), OPTIONS_RB, "write-hour", File.join(root, "store"),
                                hour.to_s, "5", stdin_data: "")
      raise "write-hour: #{e}" unless st.success? && o == "ready\n"
    end
    root
  end
  series = 'http_requests_total{path="/api/v1/accounts/:account_id/orders",status="200"}'
  truth = ruby_in("v4.2.5", "churn-expected", "2", "5").lines.first.chomp
  # [the series' line or the exporter's error, whether it is the true value, exposition]
  read = lambda do |arm, root|
    got = File.join(TMP, "compat-#{arm}-#{File.basename(root)}-#{rand(1 << 30)}.prom")
    _, e, st = Open3.capture3("ruby", "-I", lib(arm), OPTIONS_RB, "export", File.join(root, "store"), reg, "1", got)
    unless st.success?
      err = e.lines.grep(/Error/).first.to_s
      next ["#{err[/: (.*\))/, 1] || err.strip} (in #{err[%r{(formats/\w+\.rb:\d+)}, 1]})", false, nil]
    end
    line = File.readlines(got, chomp: true).find { |l| l.start_with?(series) } || "(no #{series} line)"
    [line, line == truth, got]
  end
  CSV.open(File.join(OUT, "compat.csv"), "w") do |csv|
    csv << %w[case exporter result true_value]
    mixed = store.("mixed", %w[v4.2.5 poc])  # a rolling deploy: hour 0 old layout, hour 1 new
    %w[v4.2.5 list-once poc].each { |arm| line, ok, = read.(arm, mixed); csv << ["mixed layouts (hour 0 v4.2.5, hour 1 poc)", arm, line, ok] }
    old = store.("old", %w[v4.2.5 v4.2.5])
    %w[list-once-fold poc].each { |arm| line, ok, = read.(arm, old); csv << ["store written by v4.2.5", arm, line, ok] }
    [["list-once-fold", "v4.2.5"], ["poc-fold", "poc"]].each do |folder, reader|
      d = store.("fold-#{folder}", [folder, folder])
      _, before_ok, before = read.(reader, d)
      _, folded = fold("compat", "-", folder, d)
      _, after_ok, after = read.(reader, d)
      same = before && after && File.binread(before) == File.binread(after)
      csv << ["folded by #{folder} (#{folded} files), read by unpatched #{reader}", reader,
              same ? "identical to before the fold" : "DIFFERENT", before_ok && after_ok]
    end
    ARMS.each_key do |arm|
      d = Dir.mktmpdir("u", TMP)
      csv << ["a registered labelled metric with no series", arm, ruby_in(arm, "unused-metric", d).strip, ""]
    end
  end
  log("compat: #{File.join(OUT, 'compat.csv')}")
end

EXPORT_CSV.close
FOLD_CSV.close
log("results in #{OUT}")
