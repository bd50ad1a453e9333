# Puma for the Ruby peers' measurement (measure.rb): cluster mode,
# preloaded, puma_worker_killer recycling the largest worker every
# PUMA_RECYCLE_SECS seconds; promlab's plugin only when PROMLAB_SIDECAR=1.
#
# Environment: PUMA_PORT, PUMA_WORKERS, PUMA_RECYCLE_SECS, APP_RU, and the
# plugin's PROMLAB_* variables.
workers Integer(ENV.fetch('PUMA_WORKERS', '4'))
threads 1, 4
preload_app!
bind "tcp://127.0.0.1:#{ENV.fetch('PUMA_PORT')}"
rackup ENV.fetch('APP_RU')

plugin :promlab if ENV['PROMLAB_SIDECAR'] == '1'

before_fork do
  require 'puma_worker_killer'
  PumaWorkerKiller.config do |c|
    c.ram = 1 # MB: every worker is over it, so the largest is recycled each round
    c.frequency = Float(ENV.fetch('PUMA_RECYCLE_SECS', '2'))
    c.percent_usage = 0.01
    c.rolling_restart_frequency = false
    c.reaper_status_logs = false
  end
  PumaWorkerKiller.start
end
