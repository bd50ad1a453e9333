# A Puma-like master for the sidecar's fold test
# (experiments/lab/tests/fold_exited.rs): it preloads client_ruby and keeps
# WORKERS short-lived workers alive, forking a new one whenever one exits
# (each writes WRITES jobs and exits), plus LONG workers that write for the
# whole run. Runs SECS seconds.
#
#   ruby -I CLIENT_RUBY/lib puma_master.rb STORE_DIR WORKERS LONG SECS WRITES
#
# Prints "long K wrote N" per long worker and "forked N" at the end: the
# jobs written are N * WRITES plus the long workers' own.
require 'prometheus/client'
require 'prometheus/client/data_stores/direct_file_store'

dir, workers, long, secs, writes = ARGV
workers = Integer(workers)
long = Integer(long)
secs = Float(secs)
writes = Integer(writes)
$stdout.sync = true

Prometheus::Client.config.data_store =
  Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
registry = Prometheus::Client.registry
jobs = registry.counter(:jobs_total, docstring: 'Jobs', labels: [:queue])
seconds = registry.histogram(:job_seconds, docstring: 'Job time', labels: [:queue],
                                           buckets: [0.01, 0.1, 1, 10])
# Gauges of three aggregations: a sum only incremented, a max, the newest.
depth, peak, last = { queue_depth: :sum, rss_peak: :max, last_job: :most_recent }.map do |name, agg|
  registry.gauge(name, docstring: name.to_s, labels: [:queue], store_settings: { aggregation: agg })
end
queues = %w[default mailers low]

work = lambda do |n, seed|
  n.times do |i|
    queue = queues[(seed + i) % 3]
    jobs.increment(labels: { queue: queue })
    seconds.observe(((seed * 7 + i) % 40) * 0.05, labels: { queue: queue })
    depth.increment(by: 1, labels: { queue: queue })
    peak.set((seed + i) % 1000, labels: { queue: queue })
    last.set(seed + i, labels: { queue: queue })
  end
end

stop = Time.now + secs
longs = Array.new(long) do |k|
  fork do
    rounds = 0
    while Time.now < stop
      work.(5, k * 100_000 + rounds)
      rounds += 1
      sleep 0.01
    end
    puts "long #{k} wrote #{rounds * 5}"
  end
end
seed = 0
forked = 0
alive = {}
spawn = lambda do
  seed += 1
  s = seed
  alive[fork { work.(writes, s) }] = true
  forked += 1
end
workers.times { spawn.() }
while Time.now < stop
  pid = Process.wait
  spawn.() if alive.delete(pid) && Time.now < stop
end
alive.each_key { |pid| Process.wait(pid) rescue nil }
longs.each { |pid| Process.wait(pid) rescue nil }
puts "forked #{forked}"
