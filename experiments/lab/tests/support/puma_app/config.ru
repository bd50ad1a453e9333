# A Rack app instrumented with client_ruby, for the end-to-end test
# (experiments/lab/tests/ruby_puma.rs) and the Ruby peers' measurement
# (experiments/ruby-shop/). Every request but /metrics counts once in
# app_requests_total and app_request_seconds, and once in the `sum` gauge
# app_requests_seen; the other gauges cover every aggregation. /metrics is
# client_ruby's own Rack exporter, on the same store the sidecar serves
# (its CPU time in a response header: exporter_cpu.rb).
#
# Environment: PROMLAB_STORE (the DirectFileStore directory).
require 'prometheus/client'
require 'prometheus/client/data_stores/direct_file_store'
require 'prometheus/middleware/exporter'
require 'promlab'
require_relative 'exporter_cpu'

Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: ENV.fetch('PROMLAB_STORE'))
Promlab.install

registry = Prometheus::Client.registry
REQUESTS = registry.counter(:app_requests_total, docstring: 'Requests served',
                                                 labels: %i[path code])
LATENCY = registry.histogram(:app_request_seconds, docstring: 'Time to serve a request',
                                                   labels: [:path], buckets: [0.0005, 0.001, 0.01, 0.1, 1])
SEEN = registry.gauge(:app_requests_seen, docstring: 'Requests seen (a sum gauge)',
                                          store_settings: { aggregation: :sum })
BUSY = registry.gauge(:app_worker_requests, docstring: 'Requests this worker served',
                                            store_settings: { aggregation: :all })
PEAK = registry.gauge(:app_largest_request_number, docstring: 'Highest request number seen',
                                                   store_settings: { aggregation: :max })
LOW = registry.gauge(:app_smallest_request_number, docstring: 'Lowest request number seen',
                                                   store_settings: { aggregation: :min })
LAST = registry.gauge(:app_last_request_number, docstring: 'Newest request number',
                                                store_settings: { aggregation: :most_recent })

# Counts every request.
class Instrumented
  def initialize(app)
    @app = app
    @served = 0
  end

  def call(env)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    status, headers, body = @app.call(env)
    path = env['PATH_INFO']
    n = env['QUERY_STRING'][/\bn=(\d+)/, 1].to_i
    @served += 1
    REQUESTS.increment(labels: { path: path, code: status.to_s })
    LATENCY.observe(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, labels: { path: path })
    SEEN.increment
    BUSY.set(@served)
    PEAK.set(n)
    LOW.set(n)
    LAST.set(n)
    [status, headers, body]
  end
end

use ExporterCpu
use Prometheus::Middleware::Exporter
use Instrumented
run ->(env) { [200, { 'content-type' => 'text/plain' }, ["ok #{Process.pid}\n"]] }
