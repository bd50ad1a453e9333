# Puma for the end-to-end test (experiments/lab/tests/ruby_puma.rs) and the
# Ruby peers' measurement (experiments/ruby-shop/measure.rb): cluster mode,
# preloaded, the promlab plugin starting the sidecar with --fold-exited
# (unless PROMLAB_SIDECAR=0), and puma_worker_killer recycling a worker every
# PUMA_RECYCLE_SECS seconds (its memory limit set below any worker's, so the
# largest is always over it).
#
# Environment: PUMA_PORT, PUMA_WORKERS, PUMA_RECYCLE_SECS, APP_RU (default
# config.ru here), PROMLAB_SIDECAR, and the plugin's PROMLAB_STORE,
# PROMLAB_LISTEN, PROMLAB_BIN, PROMLAB_FOLD_EVERY.
workers Integer(ENV.fetch('PUMA_WORKERS', '4'))
threads 1, 4
preload_app!
bind "tcp://127.0.0.1:#{ENV.fetch('PUMA_PORT')}"
rackup ENV.fetch('APP_RU', File.join(__dir__, 'config.ru'))

if ENV.fetch('PROMLAB_SIDECAR', '1') == '1'
  plugin :promlab
  promlab fold_exited: true
end

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
