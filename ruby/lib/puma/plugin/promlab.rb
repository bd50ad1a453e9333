# frozen_string_literal: true

require "puma/plugin"
require "promlab/sidecar"

# Puma starts promlab's /metrics sidecar from its master process (never in a
# worker) and supervises it: restarted with backoff if it dies, stopped when
# Puma stops, kept serving across a hot restart (the re-executed master
# supervises the same process). Workers recycled by phased restarts or puma_worker_killer leave
# it running; their store files are what it folds with `fold_exited`.
#
#   # config/puma.rb
#   plugin :promlab
#   promlab store: "/run/metrics", listen: "0.0.0.0:9394", fold_exited: true  # or PROMLAB_* variables
#
# Options and their environment variables: Promlab::Sidecar.
module Promlab
  # The `promlab` line of a Puma configuration.
  module PumaDSL
    def promlab(**options)
      @options[:promlab] = (@options[:promlab] || {}).merge(options)
    end
  end
end

Puma::DSL.include(Promlab::PumaDSL)

Puma::Plugin.create do
  def start(launcher)
    options = launcher.options[:promlab] || {}
    log = ->(message) { launcher.events.log("* promlab: #{message}") }
    sidecar = Promlab::Sidecar.new(logger: log, **options)
    log.call("starting #{sidecar.command.join(' ')}")
    sidecar.start
    launcher.events.on_stopped { sidecar.stop }
    # A hot restart re-executes the master, which finds this sidecar through
    # its pid file and supervises it: scrapes go on being answered meanwhile.
    launcher.events.on_restart { log.call("left running for the restarted master") }
  end
end
