# Drives promlab's Ruby supervisor (ruby/lib/promlab/sidecar.rb) for
# experiments/lab/tests/ruby_sidecar.rs: starts it with the PROMLAB_*
# variables, prints each log line as "log ..." and answers commands read from
# stdin, a line each:
#   starts      prints "starts N" (how many times it ran the binary)
#   fork-stop   a forked child calls #stop and exits; prints "forked"
#   stop        #stop; prints "stopped"
require 'promlab/sidecar'

$stdout.sync = true
sidecar = Promlab::Sidecar.new(logger: ->(message) { puts "log #{message}" })
sidecar.start
puts 'started'
while (line = $stdin.gets)
  case line.strip
  when 'starts' then puts "starts #{sidecar.starts}"
  when 'fork-stop'
    Process.wait(fork { sidecar.stop })
    puts 'forked'
  when 'stop'
    sidecar.stop
    puts 'stopped'
  end
end
