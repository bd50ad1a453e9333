# The options for client_ruby#143 (a store directory that grows with process churn), one
# step at a time, each with the client_ruby given by -I, for options_bench.sh:
#
#   ruby -I LIB options.rb churn-registry OUT_JSON
#     the churn workload's metrics, in the fixtures' registry.json format.
#   ruby -I LIB options.rb write-hour DIR HOUR WORKERS
#     the workers of simulated hour HOUR (pids from HOUR * WORKERS on, wrapping below the
#     kernel's pid_max as real pids do) each serve their hour's requests; the files stay open
#     (the workers live) until stdin closes. Prints "ready" once written.
#   ruby -I LIB options.rb churn-expected HOURS WORKERS
#     the counter lines every option must export after HOURS hours (computed here, not read).
#   ruby -I LIB options.rb fold DIR REGISTRY_JSON
#     DirectFileStore#fold_exited_processes once; prints "<cpu ns> <wall ns> <files folded>".
#   ruby -I LIB options.rb export DIR REGISTRY_JSON REPS OUT
#     Formats::Text.marshal REPS times; prints "<median wall ns> <median cpu ns> <lines>
#     <peak RSS kB after> <peak RSS kB before the first export>" and writes the exposition.
#   ruby -I LIB options.rb replay SRC_STORE REGISTRY_JSON DST
#     writes SRC_STORE (one file per metric and process) into DST through LIB's own
#     DirectFileStore, process by process in file-name order, each value `set` under its
#     file's pid: the same data in LIB's layout.
#   ruby -I LIB options.rb unused-metric DIR
#     exports a registry of two labelled counters of which only one was ever incremented;
#     prints its first line, or the error.
#   ruby -I LIB options.rb write KIND THREADS STEPS DIR
#     the write path: KIND inc (Counter#increment, short labels) or observe (Histogram#observe,
#     one 195-character label); THREADS threads, each on its own metric; prints
#     "<wall ns> <cpu ns> <operations>".
require 'json'
require 'cgi'
require 'fileutils'
require 'prometheus/client'
require 'prometheus/client/registry'
require 'prometheus/client/data_stores/direct_file_store'
require 'prometheus/client/formats/text'
# The churn's simulated pids wrap below pid_max, so this machine hands them out too, and after
# about a simulated week every one of them names a file: an exporting or folding process takes a
# simulated pid no worker gets (EXPORTER_PID) before it registers the metrics, so its
# registration files, which it then deletes, are never a worker's.
require_relative 'own_pid'

def now_ns
  Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
end

def cpu_ns
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
end

def peak_rss_kb
  File.read("/proc/self/status")[/^VmHWM:\s+(\d+)/, 1].to_i
end

DFS = Prometheus::Client::DataStores::DirectFileStore
TYPES = { "counter" => Prometheus::Client::Counter, "gauge" => Prometheus::Client::Gauge,
          "histogram" => Prometheus::Client::Histogram, "summary" => Prometheus::Client::Summary }.freeze

# A registry of REGISTRY_JSON's metrics over a DirectFileStore at dir.
def registry_over(dir, registry_json)
  Prometheus::Client.config.data_store = DFS.new(dir: dir)
  registry = Prometheus::Client::Registry.new
  JSON.parse(File.read(registry_json)).fetch("metrics").each do |m|
    args = { docstring: m["help"], labels: m["labels"].map(&:to_sym),
             store_settings: { aggregation: m["aggregation"].to_sym } }
    if m["type"] == "histogram"
      args[:buckets] = m["buckets"].map { |b| b.match?(/\A-?\d+\z/) ? Integer(b) : Float(b) }
    end
    registry.register(TYPES.fetch(m["type"]).new(m["name"].to_sym, **args))
  end
  registry
end

# --------------------------------------------------------------------------- churn workload
# A web app's workers: every request counted by path and status, its duration observed by
# path (durations are multiples of 2^-7 s, so every sum is exact in any order and an option
# that reorders additions still exports the same bytes), and each worker's peak memory.
PATHS = ["/api/v1/accounts/:account_id/orders", "/api/v1/accounts/:account_id/invoices/:id",
         "/users/sign_in", "/dashboard", "/api/v1/search"].freeze
STATUSES = %w[200 500].freeze
DURATIONS = [0.0078125, 0.03125, 0.125, 0.5, 2.0].freeze
PID_FIRST = 1000
PID_MAX = 32_768
EXPORTER_PID = PID_MAX + 1

def churn_metrics
  [{ "name" => "http_requests_total", "type" => "counter", "help" => "Requests served",
     "labels" => %w[path status], "aggregation" => "sum" },
   { "name" => "http_request_duration_seconds", "type" => "histogram", "help" => "Request time",
     "labels" => %w[path], "aggregation" => "sum",
     "buckets" => Prometheus::Client::Histogram::DEFAULT_BUCKETS.map(&:to_s) },
   { "name" => "worker_peak_rss_bytes", "type" => "gauge", "help" => "Largest worker RSS",
     "labels" => %w[app], "aggregation" => "max" }]
end

def worker_pid(n)
  PID_FIRST + n % (PID_MAX - PID_FIRST)
end

# Requests of worker n (global index) to path i with status s: a small deterministic count.
# Their durations are observed for a sample of them only (observed(k)), to keep a simulated
# week of writes to minutes; what the store holds (which series, in which files) is the same.
def requests(n, i, s)
  s.zero? ? 20 + (n * 7 + i * 13) % 50 : (n + i) % 3
end

# Pretend to be another process: DirectFileStore asks Process.pid for its file's name.
module SimulatedPid
  def pid
    $simulated_pid || super
  end
end
Process.singleton_class.prepend(SimulatedPid)

def write_hour(dir, hour, workers)
  registry = registry_over(dir, churn_registry_path(dir))
  counter, histogram, gauge = %i[http_requests_total http_request_duration_seconds
                                 worker_peak_rss_bytes].map { |n| registry.get(n) }
  kept = []
  workers.times do |w|
    n = hour * workers + w
    $simulated_pid = worker_pid(n)
    PATHS.each_with_index do |path, i|
      STATUSES.each_with_index do |status, s|
        k = requests(n, i, s)
        counter.increment(by: k, labels: { path: path, status: status })
        observed(k).times { |j| histogram.observe(DURATIONS[(n + i + j) % DURATIONS.size], labels: { path: path }) }
      end
    end
    gauge.set(100_000_000 + (n * 7919) % 50_000_000, labels: { app: "web" })
    # Keep each worker's files open, as a live worker does (the stores reopen on a new pid).
    kept << open_dicts
  end
  $simulated_pid = nil
  puts "ready"
  $stdout.flush
  $stdin.read
  kept.size
end

def open_dicts
  store = Prometheus::Client.config.data_store
  if store.instance_variable_defined?(:@internal_store)
    [store.instance_variable_get(:@internal_store)]
  else
    ObjectSpace.each_object(DFS.const_get(:MetricStore)).map { |m| m.instance_variable_get(:@internal_store) }
  end
end

def churn_registry_path(dir)
  File.join(File.dirname(dir), "registry.json")
end

def observed(requests)
  requests.zero? ? 0 : 1 + requests % 2
end

def churn_expected(hours, workers)
  totals = Hash.new(0)
  (hours * workers).times do |n|
    PATHS.each_with_index do |path, i|
      STATUSES.each_with_index { |status, s| totals[[path, status]] += requests(n, i, s) }
    end
  end
  # The order of first appearance: worker pids sort as strings, every worker writes every
  # series in the same order.
  PATHS.flat_map do |path|
    STATUSES.map { |status| "http_requests_total{path=\"#{path}\",status=\"#{status}\"} #{totals[[path, status]].to_f}" }
  end
end

# --------------------------------------------------------------------------- replay
def replay(src, registry_json, dst)
  registry = registry_over(dst, registry_json)
  by_name = registry.metrics.to_h { |m| [m.name.to_s, m] }
  stores = by_name.transform_values { |m| m.instance_variable_get(:@store) }
  files = Dir.children(src).grep(/\Ametric_(.+)___(\d+)\.bin\z/).sort
  files.group_by { |f| f[/___(\d+)\.bin\z/, 1] }.sort_by { |pid, _| "metrics___#{pid}.bin" }.each do |pid, group|
    $simulated_pid = Integer(pid)
    group.each do |f|
      name = f[/\Ametric_(.+)___\d+\.bin\z/, 1]
      store = stores.fetch(name) { abort "replay: #{f}: metric #{name} is not in the registry" }
      read_entries(File.join(src, f)).each do |key, value|
        labels = CGI.parse(key).to_h { |k, vs| [k.to_sym, vs.first] }
        labels.delete(:pid) if store.instance_variable_get(:@values_aggregation_mode) == :all
        store.set(labels: labels, val: value)
      end
    end
  end
  $simulated_pid = nil
end

def read_entries(path)
  bytes = File.binread(path)
  used = bytes.unpack1("l")
  pos = 8
  out = []
  while pos < used
    len = bytes.byteslice(pos, 4).unpack1("l")
    key = bytes.byteslice(pos + 4, len).unpack1("A*")
    out << [key, bytes.byteslice(pos + 4 + len, 8).unpack1("d")]
    pos += 4 + len + 16
  end
  out
end

# --------------------------------------------------------------------------- write path
LONG_LABEL = ("SELECT users.id, users.email, accounts.name FROM users INNER JOIN accounts " \
              "ON accounts.id = users.account_id WHERE users.state = 'active' AND " \
              "accounts.plan IN ('pro', 'team') ORDER BY users.id LIMIT ?" + " " * 195)[0, 195]

def write_bench(kind, threads, steps, dir)
  Prometheus::Client.config.data_store = DFS.new(dir: dir)
  ops = (0...threads).map do |t|
    case kind
    when "inc"
      c = Prometheus::Client::Counter.new(:"requests_#{t}_total", docstring: "r", labels: %i[path status])
      labels = { path: "/api/v1/search", status: "200" }
      -> { c.increment(labels: labels) }
    when "observe"
      h = Prometheus::Client::Histogram.new(:"query_#{t}_seconds", docstring: "q", labels: %i[statement])
      labels = { statement: LONG_LABEL }
      i = 0
      -> { h.observe(DURATIONS[(i += 1) % 5], labels: labels) }
    else abort "write: KIND is inc or observe"
    end
  end
  ops.each { |op| 1_000.times { op.call } }
  t0 = now_ns
  c0 = cpu_ns
  ops.map { |op| Thread.new { steps.times { op.call } } }.each(&:join)
  puts "#{now_ns - t0} #{cpu_ns - c0} #{steps * threads}"
end

# --------------------------------------------------------------------------- main
case ARGV.shift
when "churn-registry"
  File.write(ARGV[0], JSON.pretty_generate("metrics" => churn_metrics) + "\n")
when "write-hour"
  dir, hour, workers = ARGV
  write_hour(dir, Integer(hour), Integer(workers))
when "churn-expected"
  puts churn_expected(Integer(ARGV[0]), Integer(ARGV[1]))
when "fold"
  dir, registry_json = ARGV
  $simulated_pid = EXPORTER_PID
  registry_over(dir, registry_json)
  store = Prometheus::Client.config.data_store
  own_store_files(dir).each { |f| File.delete(f) }
  t0 = now_ns
  c0 = cpu_ns
  folded = store.fold_exited_processes
  puts "#{cpu_ns - c0} #{now_ns - t0} #{folded}"
when "export"
  dir, registry_json, reps, out = ARGV
  $simulated_pid = EXPORTER_PID
  registry = registry_over(dir, registry_json)
  own_store_files(dir).each { |f| File.delete(f) }
  before = peak_rss_kb
  text = nil
  times = Integer(reps).times.map do
    t0 = now_ns
    c0 = cpu_ns
    text = Prometheus::Client::Formats::Text.marshal(registry)
    [now_ns - t0, cpu_ns - c0]
  end
  File.binwrite(out, text)
  wall = times.map(&:first).sort[times.size / 2]
  cpu = times.map(&:last).sort[times.size / 2]
  puts "#{wall} #{cpu} #{text.count("\n")} #{peak_rss_kb} #{before}"
when "replay"
  replay(*ARGV)
when "unused-metric"
  Prometheus::Client.config.data_store = DFS.new(dir: ARGV[0])
  registry = Prometheus::Client::Registry.new
  used, _unused = %i[used_total unused_total].map do |n|
    registry.register(Prometheus::Client::Counter.new(n, docstring: n.to_s, labels: [:x]))
  end
  used.increment(labels: { x: "1" })
  begin
    text = Prometheus::Client::Formats::Text.marshal(registry)
    puts "exported #{text.lines.size} lines"
  rescue StandardError => e
    puts "#{e.class}: #{e.message.lines.first.strip}"
  end
when "write"
  kind, threads, steps, dir = ARGV
  write_bench(kind, Integer(threads), Integer(steps), dir)
else
  abort File.read(__FILE__).lines.drop(2).take_while { |l| l.start_with?("#") }.join
end
