# frozen_string_literal: true

require "json"
require "fileutils"

module Promlab
  # Writes the sidecar's registry.json from a client_ruby registry: every
  # metric's name, type, docstring, declared label names, store aggregation and
  # histogram buckets (as Ruby prints them in `le`), in registration order, the
  # order client_ruby's own exporter prints them in.
  #
  # Preset labels need no field of their own: client_ruby declares their names
  # among `labels` and writes their values into every store key.
  #
  # The file is replaced atomically (written beside it, then renamed), so the
  # sidecar never reads half of one.
  class RegistryFile
    class Error < StandardError; end

    attr_reader :path, :registry

    def initialize(path:, registry:)
      @path = path.to_s
      @registry = registry
    end

    # The registry as the sidecar reads it (a Hash ready for JSON).
    def document(metrics = registry.metrics)
      { "metrics" => metrics.map { |m| self.class.describe(m) } }
    end

    # Replaces the file with this process's registry.
    def write
      replace(document)
    end

    # Adds this process's metrics to the file, keeping what another process
    # (a worker that registered a metric of its own) wrote there, in order:
    # the file's metrics first, then this process's new ones. Under a lock,
    # so two workers registering at once lose neither.
    def merge
      lock do
        ours = document.fetch("metrics")
        theirs = read_existing
        by_name = ours.to_h { |m| [m["name"], m] }
        merged = theirs.map { |m| by_name.delete(m["name"]) || m }
        merged.concat(ours.select { |m| by_name.key?(m["name"]) })
        replace_unlocked("metrics" => merged)
      end
    end

    # One metric's entry.
    def self.describe(metric)
      type = metric.type.to_s
      entry = {
        "name" => metric.name.to_s,
        "type" => type,
        "help" => metric.docstring.to_s,
        "labels" => metric.labels.map(&:to_s),
        "aggregation" => aggregation(metric, type),
      }
      entry["buckets"] = metric.buckets.map(&:to_s) if type == "histogram"
      entry
    end

    # The store aggregation the metric was registered with, or
    # DirectFileStore's default for its type.
    def self.aggregation(metric, type)
      settings = metric.instance_variable_get(:@store_settings) || {}
      (settings[:aggregation] || (type == "gauge" ? :all : :sum)).to_s
    end

    private

    def replace(doc)
      lock { replace_unlocked(doc) }
    end

    def replace_unlocked(doc)
      text = JSON.pretty_generate(doc) + "\n"
      return false if File.file?(path) && File.binread(path) == text

      dir = File.dirname(path)
      FileUtils.mkdir_p(dir)
      tmp = File.join(dir, ".#{File.basename(path)}.#{Process.pid}.#{Thread.current.object_id}.tmp")
      begin
        File.open(tmp, "wb", 0o644) do |f|
          f.write(text)
          f.flush
          f.fsync
        end
        File.rename(tmp, path)
      ensure
        File.unlink(tmp) if File.exist?(tmp)
      end
      true
    end

    def read_existing
      return [] unless File.file?(path)

      JSON.parse(File.read(path)).fetch("metrics")
    rescue JSON::ParserError, KeyError, TypeError
      []
    end

    def lock
      lockfile = "#{path}.lock"
      FileUtils.mkdir_p(File.dirname(lockfile))
      File.open(lockfile, File::RDWR | File::CREAT, 0o644) do |f|
        f.flock(File::LOCK_EX)
        yield
      end
    end
  end
end
