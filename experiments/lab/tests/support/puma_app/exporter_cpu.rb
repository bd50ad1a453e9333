# A Rack middleware in front of an in-process /metrics exporter: it puts the
# CPU time the exporter's request took on its thread into the response header
# x-exporter-cpu-seconds, so a scraper can tell the exporter's cost from the
# rest of the worker's (experiments/ruby-shop/measure.rb).
class ExporterCpu
  def initialize(app, path: '/metrics')
    @app = app
    @path = path
  end

  def call(env)
    return @app.call(env) unless env['PATH_INFO'] == @path

    started = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    status, headers, body = @app.call(env)
    used = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - started
    headers = headers.merge('x-exporter-cpu-seconds' => format('%.6f', used))
    [status, headers, body]
  end
end
