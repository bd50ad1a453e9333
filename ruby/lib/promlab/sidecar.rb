# frozen_string_literal: true

require "promlab/common"

module Promlab
  # Runs `promlab serve` for a store directory beside a pre-fork server's
  # master and keeps it running: started once the registry file exists,
  # restarted with exponential backoff when it exits, stopped (SIGTERM, then
  # SIGKILL past a timeout) on #stop or when the process that started it
  # exits — never by a forked worker, which inherits the object but is not
  # its owner. A sidecar of the same store and flags that an earlier master
  # left running (a hot restart re-executes the master; a SIGKILL leaves it)
  # is supervised in place, not started twice. It runs in a process group of its own, so a signal meant for
  # the server's group (a terminal's Ctrl-C) reaches it only through #stop.
  #
  # Every option has an environment variable, so a deployment configures it
  # without code:
  #
  #   option        environment            default
  #   store:        PROMLAB_STORE          (required)
  #   registry:     PROMLAB_REGISTRY       STORE/registry.json
  #   listen:       PROMLAB_LISTEN         127.0.0.1:9394
  #   fold_exited:  PROMLAB_FOLD_EXITED    false ("1"/"true" turn it on)
  #   fold_every:   PROMLAB_FOLD_EVERY     the binary's (60 s)
  #   binary:       PROMLAB_BIN            promlab (on PATH)
  #   args:         PROMLAB_ARGS           none (more `serve` flags, split on spaces)
  class Sidecar
    MIN_BACKOFF = 0.5
    MAX_BACKOFF = 30.0
    # A run this long resets the backoff: it was a crash, not a crash loop.
    STEADY_SECONDS = 30.0
    STOP_TIMEOUT = 15.0

    attr_reader :store, :registry, :listen, :binary, :starts, :pid

    def self.from_env(**options)
      new(**options)
    end

    def initialize(store: nil, registry: nil, listen: nil, fold_exited: nil, fold_every: nil,
                   binary: nil, args: nil, logger: nil, env: ENV)
      @store = (store || env["PROMLAB_STORE"]).to_s
      raise Error, "no store directory: set PROMLAB_STORE or pass store:" if @store.empty?

      @registry = (registry || env["PROMLAB_REGISTRY"] || File.join(@store, REGISTRY_BASENAME)).to_s
      @listen = (listen || env["PROMLAB_LISTEN"] || "127.0.0.1:9394").to_s
      @fold_exited = fold_exited.nil? ? %w[1 true yes].include?(env["PROMLAB_FOLD_EXITED"].to_s.downcase) : fold_exited
      @fold_every = fold_every || env["PROMLAB_FOLD_EVERY"]
      @binary = (binary || env["PROMLAB_BIN"] || "promlab").to_s
      @args = args || env["PROMLAB_ARGS"].to_s.split
      @logger = logger || ->(message) { warn("promlab: #{message}") }
      @starts = 0
      @pid = nil
      @thread = nil
      @owner = nil
      @stopping = false
      @lock = Mutex.new
      @wake = ConditionVariable.new
    end

    # The command it runs.
    def command
      cmd = [binary, "serve", "--store", store, "--registry", registry, "--listen", listen]
      cmd << "--fold-exited" if @fold_exited
      cmd.push("--fold-every", @fold_every.to_s) if @fold_exited && @fold_every
      cmd + @args
    end

    # Starts supervising in a background thread of this process; returns self.
    def start
      @lock.synchronize do
        return self if @thread&.alive?

        @stopping = false
        @owner = Process.pid
        @thread = Thread.new { supervise }
      end
      owner = @owner
      at_exit { stop if Process.pid == owner }
      self
    end

    # Stops the sidecar and the supervision (only in the process that
    # started them); waits for it to exit. Safe in a signal handler (Puma
    # fires on_stopped from one): the work runs in a thread of its own.
    def stop(timeout: STOP_TIMEOUT)
      return unless @owner == Process.pid

      Thread.new { stop_now(timeout) }.join
    end

    def running?
      !@pid.nil?
    end

    private

    def stop_now(timeout)
      thread = nil
      @lock.synchronize do
        @stopping = true
        thread = @thread
        signal("TERM")
        @wake.broadcast
      end
      return unless thread
      return if thread.join(timeout)

      @lock.synchronize { signal("KILL") }
      thread.join(2)
    end

    def supervise
      backoff = MIN_BACKOFF
      waited = false
      until @stopping
        unless File.file?(registry)
          @logger.call("waiting for #{registry} (the app writes it: Promlab.install)") unless waited
          waited = true
          pause(0.2)
          next
        end
        started = monotonic
        status = run_once
        break if @stopping

        ran = monotonic - started
        backoff = MIN_BACKOFF if ran >= STEADY_SECONDS
        @logger.call("#{command.first} serve exited (#{status}) after #{ran.round(1)} s; " \
                     "restarting in #{backoff} s")
        pause(backoff)
        backoff = [backoff * 2, MAX_BACKOFF].min
      end
    rescue StandardError => e
      @logger.call("supervisor failed: #{e.class}: #{e.message}")
    end

    def run_once
      pid = @lock.synchronize do
        return "stopping" if @stopping

        adopted = leftover
        if adopted
          @pid = adopted
        else
          @starts += 1
          @pid = Process.spawn(*command, in: File::NULL, close_others: true, pgroup: true)
          File.write(pidfile, "#{@pid}\n") if File.directory?(store)
        end
        @pid
      end
      begin
        wait_for_exit(pid)
      ensure
        @lock.synchronize { @pid = nil }
      end
    rescue SystemCallError => e
      @lock.synchronize { @pid = nil }
      "not started: #{e.message}"
    end

    # Its exit status once it has exited: a child is waited for; a sidecar
    # adopted from an earlier master (not a child after a SIGKILL; still one
    # after an exec) is polled.
    def wait_for_exit(pid)
      _, status = Process.wait2(pid)
      status
    rescue Errno::ECHILD
      loop do
        Process.kill(0, pid)
        @stopping ? sleep(0.05) : pause(0.5)
      end
    rescue Errno::ESRCH
      "exited"
    end

    # Where the running sidecar's pid is kept, so the next master finds the
    # sidecar this one leaves: across a hot restart (the master re-executes
    # itself) or after a SIGKILL.
    def pidfile
      File.join(store, ".promlab-serve.pid")
    end

    # The pid of a sidecar of this store an earlier master left running, to
    # supervise in place of starting another (a hot restart keeps serving);
    # one started with other flags is stopped first, and nil returned.
    def leftover
      old = Integer(File.read(pidfile).strip, exception: false) if File.file?(pidfile)
      return unless old && old != Process.pid

      # An exited child of this process (before an exec) is reaped, not adopted.
      Process.waitpid(old, Process::WNOHANG) rescue nil
      cmdline = File.binread("/proc/#{old}/cmdline").split("\0")
      return unless cmdline.include?("serve") && cmdline.include?(store)
      if cmdline == command && !zombie?(old)
        @logger.call("supervising the sidecar an earlier master left running (pid #{old})")
        return old
      end

      @logger.call("stopping the sidecar an earlier master left running with other flags (pid #{old})")
      Process.kill("TERM", old)
      50.times do
        sleep 0.1
        Process.waitpid(old, Process::WNOHANG) rescue nil
        Process.kill(0, old)
      end
      Process.kill("KILL", old)
      nil
    rescue Errno::ENOENT, Errno::ESRCH, Errno::EPERM
      nil
    end

    def zombie?(pid)
      File.read("/proc/#{pid}/stat").split(") ").last.start_with?("Z")
    rescue Errno::ENOENT
      true
    end

    def signal(name)
      Process.kill(name, @pid) if @pid
    rescue Errno::ESRCH
      nil
    end

    def pause(seconds)
      @lock.synchronize { @wake.wait(@lock, seconds) unless @stopping }
    end

    def monotonic
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
