# One timed measurement of client_ruby, for run.sh's interleaved rounds.
#
#   ruby -I CLIENT_RUBY/lib bench.rb export REGISTRY_JSON STORE_DIR REPS [OUT_FILE]
#     registers REGISTRY_JSON's metrics over STORE_DIR (a scratch directory of symlinks,
#     as export.rb), then times REPS calls of Formats::Text.marshal; prints
#     "<median wall ns per export> <median CPU ns per export> <lines>", and writes the last
#     exposition to OUT_FILE if given.
#   ruby -I CLIENT_RUBY/lib bench.rb write SCRATCH_DIR STEPS
#     a Histogram observe + a Counter increment labelled with one 195-character SQL
#     statement, DirectFileStore in SCRATCH_DIR; 1,000 warm-up steps, then STEPS timed;
#     prints "<wall ns per step> <CPU ns per step> <steps>".
require 'json'
require 'prometheus/client'
require 'prometheus/client/registry'
require 'prometheus/client/data_stores/direct_file_store'
require 'prometheus/client/formats/text'
require_relative 'own_pid'

def now_ns
  Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
end

def cpu_ns
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
end

mode = ARGV.shift
case mode
when "export"
  registry_json, dir, reps, out = ARGV
  work_under_a_pid_the_store_lacks(dir)
  Prometheus::Client.config.data_store =
    Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
  registry = Prometheus::Client::Registry.new
  JSON.parse(File.read(registry_json)).fetch("metrics").each do |m|
    args = { docstring: m["help"], labels: m["labels"].map(&:to_sym),
             store_settings: { aggregation: m["aggregation"].to_sym } }
    klass = { "counter" => Prometheus::Client::Counter, "gauge" => Prometheus::Client::Gauge,
              "histogram" => Prometheus::Client::Histogram,
              "summary" => Prometheus::Client::Summary }.fetch(m["type"])
    if m["type"] == "histogram"
      args[:buckets] = m["buckets"].map { |b| b.match?(/\A-?\d+\z/) ? Integer(b) : Float(b) }
    end
    registry.register(klass.new(m["name"].to_sym, **args))
  end
  Dir.glob(File.join(dir, "metric_*___#{Process.pid}.bin")).each { |f| File.delete(f) }

  lines = nil
  text = nil
  times = Integer(reps).times.map do
    t = now_ns
    c = cpu_ns
    text = Prometheus::Client::Formats::Text.marshal(registry)
    elapsed = [now_ns - t, cpu_ns - c]
    lines = text.count("\n")
    elapsed
  end
  File.binwrite(out, text) if out
  wall = times.map(&:first).sort[times.size / 2]
  cpu = times.map(&:last).sort[times.size / 2]
  puts "#{wall} #{cpu} #{lines}"
when "write"
  dir, steps = ARGV
  Prometheus::Client.config.data_store =
    Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
  histogram = Prometheus::Client::Histogram.new(:request_seconds, docstring: "Request time",
                                                labels: [:statement])
  counter = Prometheus::Client::Counter.new(:requests_total, docstring: "Requests",
                                            labels: [:statement])
  statement = ("SELECT users.id, users.email, accounts.name FROM users INNER JOIN accounts " \
               "ON accounts.id = users.account_id WHERE users.state = 'active' AND " \
               "accounts.plan IN ('pro', 'team') ORDER BY users.id LIMIT ?")
  statement = (statement + " " * 195)[0, 195]
  raise "label is #{statement.size} chars" unless statement.size == 195
  values = [0.003, 0.03, 0.3, 3.0]
  step = lambda do |i|
    labels = { statement: statement }
    histogram.observe(values[i & 3], labels: labels)
    counter.increment(labels: labels)
  end
  1_000.times { |i| step.(i) }
  n = Integer(steps)
  t = now_ns
  c = cpu_ns
  n.times { |i| step.(i) }
  puts "#{(now_ns - t) / n} #{(cpu_ns - c) / n} #{n}"
else
  abort "usage: bench.rb export REGISTRY_JSON STORE_DIR REPS | write SCRATCH_DIR STEPS"
end
