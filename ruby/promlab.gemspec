# frozen_string_literal: true

require_relative "lib/promlab/version"

Gem::Specification.new do |s|
  s.name = "promlab"
  s.version = Promlab::VERSION
  s.summary = "Writes promlab's sidecar registry from client_ruby, and runs the sidecar beside Puma"
  s.description = <<~TEXT
    The Ruby side of promlab's /metrics sidecar for prometheus/client_ruby's
    DirectFileStore: Promlab.install writes the registry file the sidecar reads
    from Prometheus::Client.registry (at boot and on every later registration);
    the Puma plugin (`plugin :promlab`) starts and supervises the sidecar from
    Puma's master; promlab-sidecar does the same beside Unicorn, Passenger or
    in a container.
  TEXT
  s.authors = ["promlab developers"]
  s.license = "Apache-2.0"
  s.files = Dir["lib/**/*.rb"] + Dir["exe/*"]
  s.bindir = "exe"
  s.executables = ["promlab-sidecar"]
  s.require_paths = ["lib"]
  s.required_ruby_version = ">= 2.7"
  # prometheus-client (client_ruby) 4.x or 5.x is what the app loads; it is not
  # declared, so the gem installs beside Debian's packages without a download.
end
