# frozen_string_literal: true

require "prometheus/client"
require "promlab/version"
require "promlab/common"
require "promlab/registry_file"
require "promlab/sidecar"

# promlab's Ruby side: the registry file its sidecar reads, written by the
# app, and the sidecar's supervisor (promlab/sidecar, the Puma plugin
# puma/plugin/promlab).
#
#   Prometheus::Client.config.data_store =
#     Prometheus::Client::DataStores::DirectFileStore.new(dir: "/run/metrics")
#   Promlab.install   # writes /run/metrics/registry.json now and on every later register
module Promlab
  @writers = {}
  @mutex = Mutex.new

  class << self
    # Writes `registry`'s file now, replacing what an earlier boot left, and
    # again (merged, see RegistryFile#merge) whenever a metric is registered
    # in it later, in this process or a forked one. `path` defaults to
    # $PROMLAB_REGISTRY, else registry.json in the DirectFileStore's directory.
    def install(path: nil, registry: Prometheus::Client.registry)
      check_client!
      path ||= ENV["PROMLAB_REGISTRY"] || default_registry_path
      writer = RegistryFile.new(path: path, registry: registry)
      @mutex.synchronize { @writers[registry] = writer }
      writer.write
      writer
    end

    # Stops following `registry` (the file stays).
    def uninstall(registry: Prometheus::Client.registry)
      @mutex.synchronize { @writers.delete(registry) }
    end

    # Called after a metric is registered (Prometheus::Client::Registry#register).
    def registered(registry)
      writer = @mutex.synchronize { @writers[registry] }
      writer&.merge
    end

    # The directory of the configured DirectFileStore.
    def store_dir
      store = Prometheus::Client.config.data_store
      settings = store.instance_variable_get(:@store_settings) if store
      dir = settings[:dir] if settings.is_a?(Hash)
      return dir.to_s if dir

      raise Error, "the data store is #{store.class}, not a DirectFileStore: configure " \
                   "Prometheus::Client.config.data_store before Promlab.install, or pass path:"
    end

    def default_registry_path
      File.join(store_dir, REGISTRY_BASENAME)
    end

    private

    # prometheus-client-mmap installs its own `prometheus/client`; its store
    # is not the one the sidecar reads.
    def check_client!
      return if Prometheus::Client.respond_to?(:config) &&
                Prometheus::Client.config.respond_to?(:data_store)

      raise Error, "the loaded prometheus/client is not client_ruby (prometheus-client-mmap " \
                   "shadows it?): load client_ruby first (-I or Bundler)"
    end
  end

  # Tells Promlab after each registration.
  module RegistryHook
    def register(metric)
      result = super
      Promlab.registered(self)
      result
    end
  end
end

Prometheus::Client::Registry.prepend(Promlab::RegistryHook)
