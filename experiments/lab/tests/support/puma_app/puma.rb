# Puma for the end-to-end test: cluster mode, preloaded, the promlab plugin
# starting the sidecar with --fold-exited, and puma_worker_killer recycling a
# worker every PUMA_RECYCLE_SECS seconds (its memory limit set below any
# worker's, so the largest is always over it).
#
# Environment: PUMA_PORT, PUMA_WORKERS, PUMA_RECYCLE_SECS, PROMLAB_STORE,
# PROMLAB_LISTEN, PROMLAB_BIN, PROMLAB_FOLD_EVERY.
workers Integer(ENV.fetch('PUMA_WORKERS', '4'))
threads 1, 4
preload_app!
bind "tcp://127.0.0.1:#{ENV.fetch('PUMA_PORT')}"
rackup File.join(__dir__, 'config.ru')

plugin :promlab
promlab fold_exited: true

before_fork do
  require 'puma_worker_killer'
  PumaWorkerKiller.config do |c|
    c.ram = 1 # MB: every worker is over it, so the largest is recycled each round
    c.frequency = Float(ENV.fetch('PUMA_RECYCLE_SECS', '1'))
    c.percent_usage = 0.01
    c.rolling_restart_frequency = false
    c.reaper_status_logs = false
  end
  PumaWorkerKiller.start
end
