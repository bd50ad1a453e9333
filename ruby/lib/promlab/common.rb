# frozen_string_literal: true

module Promlab
  class Error < StandardError; end

  # The registry file is, unless told otherwise, `registry.json` in the store
  # directory: one directory to share between the app and the sidecar.
  REGISTRY_BASENAME = "registry.json"
end
