# Render a client_ruby DirectFileStore directory with client_ruby's own exporter.
#
#   ruby -I CLIENT_RUBY/lib export.rb REGISTRY_JSON STORE_DIR [OUT_FILE]
#
# Registers the metrics of REGISTRY_JSON (a fixture's registry.json: name, type, help,
# labels, aggregation, histogram buckets as Ruby prints them) in a fresh registry whose
# DirectFileStore points at STORE_DIR, then writes Formats::Text.marshal of it.
# Registering an unlabeled metric makes client_ruby write its zero series into this
# process's own file (metric_<name>___<pid>.bin, or metrics___<pid>.bin with the
# poc_file_per_process branch); those files are removed before the
# export, so STORE_DIR must be a scratch directory (symlinks to the fixture's files).
require 'json'
require 'prometheus/client'
require 'prometheus/client/registry'
require 'prometheus/client/data_stores/direct_file_store'
require 'prometheus/client/formats/text'
require_relative 'own_pid'

registry_json, dir, out = ARGV
abort "usage: export.rb REGISTRY_JSON STORE_DIR [OUT]" unless registry_json && dir

work_under_a_pid_the_store_lacks(dir)

Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
registry = Prometheus::Client::Registry.new

def bucket(text)
  text.match?(/\A-?\d+\z/) ? Integer(text) : Float(text)
end

JSON.parse(File.read(registry_json)).fetch("metrics").each do |m|
  args = {
    docstring: m.fetch("help"),
    labels: m.fetch("labels").map(&:to_sym),
    store_settings: { aggregation: m.fetch("aggregation").to_sym },
  }
  metric = case m.fetch("type")
           when "counter" then Prometheus::Client::Counter.new(m["name"].to_sym, **args)
           when "gauge" then Prometheus::Client::Gauge.new(m["name"].to_sym, **args)
           when "histogram"
             Prometheus::Client::Histogram.new(m["name"].to_sym, **args,
                                              buckets: m.fetch("buckets").map { |b| bucket(b) })
           when "summary" then Prometheus::Client::Summary.new(m["name"].to_sym, **args)
           else abort "export.rb: unknown type #{m['type']}"
           end
  registry.register(metric)
end

own_store_files(dir).each { |f| File.delete(f) }

text = Prometheus::Client::Formats::Text.marshal(registry)
out ? File.binwrite(out, text) : $stdout.write(text)
