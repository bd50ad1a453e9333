# An app instrumented with client_ruby that writes the sidecar's registry with
# promlab's Ruby library (ruby/lib), for experiments/lab/tests/ruby_registry.rs.
#
#   ruby -I CLIENT_RUBY/lib -I ruby/lib registry_app.rb fixture STORE_DIR
#     registers the metrics of the fixtures' all-types case, as that app did,
#     and writes STORE_DIR/registry.json (nothing else)
#   ruby -I CLIENT_RUBY/lib -I ruby/lib registry_app.rb app STORE_DIR OUT
#     registers every kind of metric (preset labels, every gauge aggregation,
#     integer, float and default histogram buckets, a summary, unlabeled
#     metrics), forks writers, one of which registers a metric of its own
#     after the fork; then the parent registers that one too and writes
#     client_ruby's own exposition of the store to OUT
require 'prometheus/client'
require 'prometheus/client/data_stores/direct_file_store'
require 'prometheus/client/formats/text'

mode, dir, out = ARGV
Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
require 'promlab'
Promlab.install
r = Prometheus::Client.registry

def gauge(r, name, help, labels, agg)
  r.gauge(name, docstring: help, labels: labels, store_settings: { aggregation: agg })
end

case mode
when 'fixture'
  r.counter(:http_requests_total, docstring: "Requests.\nSecond line with \\ backslash and \"quotes\"",
                                  labels: %i[path code])
  r.gauge(:workers_busy, docstring: 'Busy workers per process', labels: [:pool])
  gauge(r, :queue_depth, 'Queue depth', [:queue], :sum)
  gauge(r, :memory_peak_bytes, 'Peak memory', [], :max)
  gauge(r, :free_slots, 'Free slots', [], :min)
  gauge(r, :last_deploy_timestamp, 'Last deploy', [:env], :most_recent)
  r.histogram(:payload_bytes, docstring: 'Payload size', labels: [:route],
                              buckets: [100, 1000, 25_000.0, 1e6])
  r.histogram(:tiny_seconds, docstring: 'Tiny latencies', buckets: [1e-6, 0.0001, 0.5, 1.0])
  r.summary(:job_seconds, docstring: 'Job duration', labels: [:job])
when 'app'
  requests = r.counter(:http_requests_total, docstring: "Requests.\nWith \\ and \"quotes\"",
                                             labels: %i[path code])
  tenant = r.counter(:tenant_jobs_total, docstring: 'Jobs per tenant', labels: %i[tenant queue],
                                         preset_labels: { tenant: 'acme' })
  region = r.gauge(:region_up, docstring: 'Every label preset', labels: [:region],
                               preset_labels: { region: 'eu-west' },
                               store_settings: { aggregation: :max })
  boots = r.counter(:boots_total, docstring: 'Unlabeled: its zero series is written at registration')
  gauges = %i[all sum max min most_recent].to_h do |agg|
    [agg, gauge(r, :"pool_#{agg}", "Gauge aggregated by #{agg}", [:pool], agg)]
  end
  sizes = r.histogram(:payload_bytes, docstring: 'Integer and float buckets', labels: [:route],
                                      buckets: [100, 1000, 25_000.0, 1e6])
  tiny = r.histogram(:tiny_seconds, docstring: 'Tiny buckets', buckets: [1e-6, 0.0001, 0.5, 1])
  latency = r.histogram(:latency_seconds, docstring: 'Default buckets', labels: [:path])
  jobs = r.summary(:job_seconds, docstring: 'A summary', labels: [:job])
  child = r.counter(:child_total, docstring: 'Preset through with_labels', labels: %i[kind path])
                   .with_labels(kind: 'sub')

  pids = Array.new(3) do |w|
    fork do
      20.times do |i|
        path = ['/a', "/b c&d=%#{i % 3}", 'café ~*', "new\nline"][i % 4]
        requests.increment(labels: { path: path, code: (200 + 100 * (i % 3)).to_s })
        tenant.increment(by: 0.5, labels: { queue: "q#{i % 2}" })
        region.set(w * 10 + i)
        boots.increment if i.zero?
        gauges.each { |agg, g| agg == :sum ? g.increment(labels: { pool: 'web' }) : g.set(w * 100 + i, labels: { pool: 'web' }) }
        sizes.observe(10**(i % 7), labels: { route: path })
        tiny.observe(i * 1e-5)
        latency.observe(0.003 * i, labels: { path: path })
        jobs.observe(i * 0.25, labels: { job: "j#{i % 2}" })
        child.increment(labels: { path: path })
      end
      if w == 1
        late = r.gauge(:late_registered, docstring: 'Registered by a worker after the fork',
                                         labels: [:pool], store_settings: { aggregation: :sum })
        late.set(7, labels: { pool: 'web' })
      end
    end
  end
  pids.each { |pid| Process.wait(pid) }
  abort 'a writer failed' unless $?.success?
  r.gauge(:late_registered, docstring: 'Registered by a worker after the fork',
                            labels: [:pool], store_settings: { aggregation: :sum })
  File.binwrite(out, Prometheus::Client::Formats::Text.marshal(r))
else
  abort "usage: registry_app.rb fixture|app STORE_DIR [OUT]"
end
