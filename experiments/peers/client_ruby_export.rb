# client_ruby's own exporter, timed: the `peer:client_ruby-*` rows of `promlab ablate --peers`.
#
#   ruby -I CLIENT_RUBY/lib client_ruby_export.rb REGISTRY_JSON STORE_DIR REPEATS OUT_FILE
#
# Registers REGISTRY_JSON's metrics (a fixture's registry.json: name, type, help, labels,
# aggregation, histogram buckets as Ruby prints them) in a fresh registry whose DirectFileStore
# points at STORE_DIR, removes the zero series that registering unlabeled metrics writes into this
# process's own files, renders Formats::Text.marshal once untimed (written to OUT_FILE, which
# promlab compares with its verified exposition), then REPEATS timed renders. Prints one JSON
# line: the Ruby and client_ruby versions, per timed render [wall ns, CPU ns of this process],
# the exposition's lines and the process's peak RSS (VmHWM). STORE_DIR must be a scratch copy.
require 'json'
require 'prometheus/client'
require 'prometheus/client/registry'
require 'prometheus/client/data_stores/direct_file_store'
require 'prometheus/client/formats/text'
require 'prometheus/client/version'
# The store's pids may include this process's: own_pid.rb moves the work to a child then. Beside
# this script where promlab writes both, in experiments/upstream/client_ruby/ in the repository.
begin
  require_relative 'own_pid'
rescue LoadError
  require_relative '../upstream/client_ruby/own_pid'
end

registry_json, dir, repeats, out = ARGV
abort "usage: client_ruby_export.rb REGISTRY_JSON STORE_DIR REPEATS OUT_FILE" unless out

work_under_a_pid_the_store_lacks(dir)

Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
registry = Prometheus::Client::Registry.new

JSON.parse(File.read(registry_json)).fetch("metrics").each do |m|
  args = { docstring: m.fetch("help"), labels: m.fetch("labels").map(&:to_sym),
           store_settings: { aggregation: m.fetch("aggregation").to_sym } }
  klass = { "counter" => Prometheus::Client::Counter, "gauge" => Prometheus::Client::Gauge,
            "histogram" => Prometheus::Client::Histogram,
            "summary" => Prometheus::Client::Summary }.fetch(m.fetch("type"))
  if m["type"] == "histogram"
    args[:buckets] = m.fetch("buckets").map { |b| b.match?(/\A-?\d+\z/) ? Integer(b) : Float(b) }
  end
  registry.register(klass.new(m.fetch("name").to_sym, **args))
end
Dir.glob(File.join(dir, "metric_*___#{Process.pid}.bin")).each { |f| File.delete(f) }

def clock(id)
  Process.clock_gettime(id, :nanosecond)
end

text = Prometheus::Client::Formats::Text.marshal(registry)
File.binwrite(out, text)
samples = Integer(repeats).times.map do
  wall = clock(Process::CLOCK_MONOTONIC)
  cpu = clock(Process::CLOCK_PROCESS_CPUTIME_ID)
  Prometheus::Client::Formats::Text.marshal(registry)
  [clock(Process::CLOCK_MONOTONIC) - wall, clock(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu]
end
hwm = File.read("/proc/self/status")[/^VmHWM:\s+(\d+)/, 1].to_i
puts JSON.generate(ruby: RUBY_VERSION, client_ruby: Prometheus::Client::VERSION,
                   samples: samples, lines: text.count("\n"), rss_kib: hwm)
