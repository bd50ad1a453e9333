# A pre-fork app's workers writing a client_ruby DirectFileStore, for the
# fold tests (experiments/lab/tests/fold_exited.rs).
#
#   ruby -I CLIENT_RUBY/lib fold_app.rb STORE_DIR WORKERS ROUND
#
# Forks WORKERS workers that each write every metric once and exit, then one
# more that writes, prints "ready", waits for a line on stdin, writes again
# and exits (a worker still running while the store is folded). Every
# worker counts 1 into requests_total{path="/a"} per write, so after a round
# the total grows by WORKERS + 2. The parent writes nothing.
require 'prometheus/client'
require 'prometheus/client/data_stores/direct_file_store'

dir, workers, round = ARGV
workers = Integer(workers)
round = Integer(round)

Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
registry = Prometheus::Client.registry
requests = registry.counter(:requests_total, docstring: 'Requests', labels: [:path])
latency = registry.histogram(:latency_seconds, docstring: 'Latency', labels: [:path],
                                               buckets: [0.01, 0.1, 1])
size = registry.summary(:size_bytes, docstring: 'Sizes', labels: [:path])
busy = registry.gauge(:workers_busy, docstring: 'Busy', labels: [:pool])
peak = registry.gauge(:memory_peak_bytes, docstring: 'Peak', labels: [:pool],
                                           store_settings: { aggregation: :max })
low = registry.gauge(:free_slots, docstring: 'Low water', labels: [:pool],
                                  store_settings: { aggregation: :min })
deploy = registry.gauge(:last_deploy, docstring: 'Deploy', labels: [:pool],
                                      store_settings: { aggregation: :most_recent })
queued = registry.gauge(:queue_depth, docstring: 'Queued', labels: [:pool],
                                      store_settings: { aggregation: :sum })

write = lambda do |i|
  requests.increment(labels: { path: '/a' })
  requests.increment(by: i, labels: { path: "/b c&d=%#{i % 3}" })
  latency.observe(0.001 * (i + 1), labels: { path: '/a' })
  size.observe(100 * i + 0.5, labels: { path: '/a' })
  busy.set(i + round, labels: { pool: 'web' })
  peak.set(1000 + i * 7 + round, labels: { pool: 'web' })
  low.set(50 - i - round, labels: { pool: 'web' })
  deploy.set(round * 100 + i, labels: { pool: 'web' })
  queued.increment(by: 2, labels: { pool: 'web' })
end

workers.times do |i|
  Process.wait(fork { write.(i) })
end

live = IO.pipe
reply = IO.pipe
pid = fork do
  live[1].close
  reply[0].close
  write.(workers)
  reply[1].puts 'ready'
  reply[1].flush
  live[0].gets
  write.(workers + 1)
end
live[0].close
reply[1].close
$stdout.puts reply[0].gets
$stdout.flush
# The parent passes its stdin's line on to the live worker.
$stdin.gets
live[1].puts 'go'
live[1].close
Process.wait(pid)
