# The app of experiments/lab/tests/support/puma_app/config.ru instrumented
# with prometheus-client-mmap 0.16.2 (Debian's ruby-prometheus-client-mmap;
# loaded from Ruby's vendor path, so client_ruby must NOT be on -I) and served
# its own way: its Rack exporter on /metrics, reading every process's .db
# files. The same metrics; its gauge modes have no most_recent, and its sum
# is livesum (exited processes' values dropped).
#
# Environment: PROMLAB_STORE (its multiprocess_files_dir).
require 'prometheus/client'
require 'prometheus/client/rack/exporter'
require_relative '../lab/tests/support/puma_app/exporter_cpu'

Prometheus::Client.configure do |c|
  c.multiprocess_files_dir = ENV.fetch('PROMLAB_STORE')
  c.logger = Logger.new(File::NULL)
end
registry = Prometheus::Client.registry
REQUESTS = registry.counter(:app_requests_total, 'Requests served')
LATENCY = registry.histogram(:app_request_seconds, 'Time to serve a request', {},
                             [0.0005, 0.001, 0.01, 0.1, 1])
SEEN = registry.gauge(:app_requests_seen, 'Requests seen (a sum gauge)', {}, :livesum)
BUSY = registry.gauge(:app_worker_requests, 'Requests this worker served', {}, :all)
PEAK = registry.gauge(:app_largest_request_number, 'Highest request number seen', {}, :max)
LOW = registry.gauge(:app_smallest_request_number, 'Lowest request number seen', {}, :min)

# Counts every request, as the client_ruby app does.
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
    REQUESTS.increment({ path: path, code: status.to_s })
    LATENCY.observe({ path: path }, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
    SEEN.increment({}, 1)
    BUSY.set({}, @served)
    PEAK.set({}, n)
    LOW.set({}, n)
    [status, headers, body]
  end
end

use ExporterCpu
use Prometheus::Client::Rack::Exporter
use Instrumented
run ->(env) { [200, { 'content-type' => 'text/plain' }, ["ok #{Process.pid}\n"]] }
