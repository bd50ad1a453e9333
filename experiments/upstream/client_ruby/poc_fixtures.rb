# Writes a store case in the layout of client_ruby's `poc_file_per_process`
# branch (one file per process, `metrics___<pid>.bin`) by replaying the op logs
# of a case that client_ruby 4.2.5 wrote, with the branch's own code, and
# renders the branch's own exposition of it as `expected.prom`.
#
#   ruby -I <poc>/lib poc_fixtures.rb <case dir with registry.json and ops-*.jsonl> <out dir>
#
# The process that wrote the first op log (the smallest pid: the one that
# registered the metrics and exported) replays it in this process; every
# other log is replayed, one after the other, in a process forked for it.
# The store files are trimmed after their used region (readers rely on
# `used`, never on the file size), and the trimmed store is exported again
# and must give the same bytes. Needs the branch's lib first on the load path:
# Debian's ruby-prometheus-client-mmap installs another `prometheus/client`.

require 'json'
require 'fileutils'
require 'prometheus/client'
require 'prometheus/client/formats/text'
require 'prometheus/client/data_stores/direct_file_store'

source, out = ARGV
abort "usage: ruby -I <poc>/lib #{$0} <case dir> <out dir>" unless source && out
unless Prometheus::Client::DataStores::DirectFileStore.instance_method(:filemap_filename)
         .owner == Prometheus::Client::DataStores::DirectFileStore
  abort 'this is not the one-file-per-process DirectFileStore: put its lib first with -I'
end

store_dir = File.join(out, 'store')
FileUtils.rm_rf(out)
FileUtils.mkdir_p(store_dir)
Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: store_dir)

registry_json = JSON.parse(File.read(File.join(source, 'registry.json')))
registry = Prometheus::Client::Registry.new
metrics = {}

# A bucket bound as registry.json prints it: "1" is the Integer 1, "2.5" a Float.
def bound(text)
  text.match?(/\A-?\d+\z/) ? Integer(text) : Float(text)
end

def number(value)
  case value
  when 'Infinity' then Float::INFINITY
  when '-Infinity' then -Float::INFINITY
  when 'NaN' then Float::NAN
  else value
  end
end

registry_json['metrics'].each do |m|
  name = m['name'].to_sym
  labels = m['labels'].map(&:to_sym)
  settings = { aggregation: m['aggregation'].to_sym }
  metric =
    case m['type']
    when 'counter'
      Prometheus::Client::Counter.new(name, docstring: m['help'], labels: labels,
                                            store_settings: settings)
    when 'gauge'
      Prometheus::Client::Gauge.new(name, docstring: m['help'], labels: labels,
                                          store_settings: settings)
    when 'histogram'
      Prometheus::Client::Histogram.new(name, docstring: m['help'], labels: labels,
                                              buckets: m['buckets'].map { |b| bound(b) },
                                              store_settings: settings)
    when 'summary'
      Prometheus::Client::Summary.new(name, docstring: m['help'], labels: labels,
                                            store_settings: settings)
    else abort "unknown metric type #{m['type']}"
    end
  registry.register(metric)
  metrics[m['name']] = metric
end

# Replays one op log in this process; returns the ops, with this process's pid.
def replay(path, metrics, first)
  File.readlines(path).map do |line|
    op = JSON.parse(line)
    metric = metrics.fetch(op['metric'])
    labels = op['labels'].transform_keys(&:to_sym)
    value = number(op['value'])
    case op['op']
    # Registering an unlabeled metric wrote its zero series in the first process.
    when 'init' then metric.send(:init_label_set, {}) unless first
    when 'inc' then metric.increment(by: value, labels: labels)
    when 'dec' then metric.decrement(by: value, labels: labels)
    when 'set' then metric.set(value, labels: labels)
    when 'observe' then metric.observe(value, labels: labels)
    else abort "unknown op #{op['op']}"
    end
    op.merge('pid' => Process.pid).to_json
  end
end

logs = Dir.glob(File.join(source, 'ops-*.jsonl')).sort_by { |p| p[/ops-(\d+)/, 1].to_i }
logs.each_with_index do |log, i|
  if i.zero?
    ops = replay(log, metrics, true)
    File.write(File.join(out, "ops-#{Process.pid}.jsonl"), ops.join("\n") + "\n")
  else
    child = fork do
      ops = replay(log, metrics, false)
      File.write(File.join(out, "ops-#{Process.pid}.jsonl"), ops.join("\n") + "\n")
      exit!(0)
    end
    Process.wait(child)
    abort "replaying #{log} failed" unless $?.success?
  end
end

exposition = Prometheus::Client::Formats::Text.marshal(registry)
Dir.glob(File.join(store_dir, '*')).each do |file|
  used = File.binread(file, 4).unpack1('l')
  File.truncate(file, used)
end
again = Prometheus::Client::Formats::Text.marshal(registry)
abort 'the trimmed store exports differently' unless again == exposition
File.write(File.join(out, 'expected.prom'), exposition)
FileUtils.cp(File.join(source, 'registry.json'), File.join(out, 'registry.json'))
puts "#{out}: #{Dir.children(store_dir).size} store files, #{exposition.lines.size} lines"
