# frozen_string_literal: true

module Promlab
  VERSION = "0.1.0"
end
