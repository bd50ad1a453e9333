# The tables of one options_bench.rb run, in Markdown:
#
#   ruby experiments/upstream/client_ruby/options_summary.rb RUN_DIR > RUN_DIR/summary.md
require 'csv'

dir = ARGV.fetch(0) { abort "usage: options_summary.rb RUN_DIR" }
ARMS = %w[v4.2.5 list-once list-once-fold poc poc-fold].freeze

def read(dir, name)
  path = File.join(dir, name)
  File.exist?(path) ? CSV.read(path, headers: true) : nil
end

def table(head, rows)
  ["| #{head.join(' | ')} |", "|#{head.map { ' --- |' }.join}", *rows.map { |r| "| #{r.join(' | ')} |" }].join("\n")
end

def median(xs)
  s = xs.sort
  s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
end

def ms(ns)
  v = ns / 1e6
  v >= 100 ? format("%.0f ms", v) : format("%.1f ms", v)
end

def secs_or_ms(ns)
  ns >= 1e9 ? format("%.2f s", ns / 1e9) : ms(ns)
end

def mib(bytes)
  bytes >= 1 << 30 ? format("%.1f GiB", bytes / 2.0**30) : format("%.1f MiB", bytes / 2.0**20)
end

puts "# client_ruby#143: the options side by side"
puts
puts "```"
puts File.read(File.join(dir, "machine.txt"))
puts "```"

if (rspec = read(dir, "rspec.csv"))
  puts "\n## rspec (client_ruby's own suite with the option's patches)\n\n"
  puts table(%w[option examples failures seconds], rspec.map { |r| [r["arm"], r["examples"], r["failures"], r["seconds"]] })
end

if (write = read(dir, "write.csv"))
  puts "\n## Write path (median of 3 interleaved rounds; wall ns per operation, all threads' operations counted)\n\n"
  tasks = write.map { |r| [r["task"], r["threads"]] }.uniq
  rows = tasks.map do |task, threads|
    per = ARMS.to_h do |arm|
      rs = write.select { |r| r["task"] == task && r["threads"] == threads && r["arm"] == arm }
      [arm, median(rs.map { |r| r["wall_ns"].to_f / r["ops"].to_f })]
    end
    name = task == "inc" ? "Counter#increment" : "Histogram#observe, 195-char label"
    ["#{name}, #{threads} thread#{threads == '1' ? '' : 's'}",
     *ARMS.map { |a| a == "v4.2.5" ? format("%.1f µs", per[a] / 1e3) : format("%.1f µs (%.2f×)", per[a] / 1e3, per["v4.2.5"] / per[a]) }]
  end
  puts table(["task", *ARMS], rows)
  puts "\n(× = v4.2.5's time / the option's: above 1 is faster. With threads, each thread writes its own metric.)"
end

exports = read(dir, "export.csv")
folds = read(dir, "fold.csv")
if exports
  fixed = exports.reject { |r| r["workload"] == "churn" }
  unless fixed.empty?
    puts "\n## Fixed stores: one export each (CPU time of Formats::Text.marshal; seed repro: median of 3)\n\n"
    rows = fixed.map do |r|
      [r["workload"], r["arm"], r["files"], secs_or_ms(r["cpu_ns"].to_f), secs_or_ms(r["wall_ns"].to_f),
       format("%.0f MiB (+%.0f)", r["peak_rss_kb"].to_f / 1024, (r["peak_rss_kb"].to_f - r["rss_before_kb"].to_f) / 1024),
       "#{r['result']} (#{r['reference']})"]
    end
    puts table(["store", "option", "files", "export CPU", "export wall", "peak RSS (+ during export)", "bytes"], rows)
    if folds
      prep = folds.select { |r| r["point"] == "prepare" }
      unless prep.empty?
        puts "\nThe fold arms' stores were folded first (every process exited), by the option's own fold:\n\n"
        puts table(["store", "option", "fold CPU", "fold wall", "files folded", "files after"],
                   prep.map { |r| [r["workload"], r["arm"], secs_or_ms(r["cpu_ns"].to_f), secs_or_ms(r["wall_ns"].to_f), r["files_folded"], r["files_after"]] })
      end
    end
  end

  churn = exports.select { |r| r["workload"] == "churn" }
  unless churn.empty?
    points = churn.map { |r| r["point"] }.uniq
    puts "\n## Churn: workers recycled every simulated hour (one export per option per sample)\n\n"
    puts "### Store directory (files, apparent size, disk used)\n\n"
    stores = { "one file per metric and process (v4.2.5, list-once)" => "v4.2.5", "… folded (list-once-fold)" => "list-once-fold",
               "one file per process (poc)" => "poc", "… folded (poc-fold)" => "poc-fold" }
    puts table(["store", *points], stores.map do |label, arm|
      [label, *points.map do |p|
        r = churn.find { |x| x["point"] == p && x["arm"] == arm }
        r ? "#{r['files']} files, #{mib(r['apparent_bytes'].to_f)} / #{mib(r['disk_bytes'].to_f)}" : "—"
      end]
    end)
    puts "\n### Export CPU time (and peak RSS of the exporting process)\n\n"
    puts table(["option", *points], ARMS.map do |arm|
      [arm, *points.map do |p|
        r = churn.find { |x| x["point"] == p && x["arm"] == arm }
        r ? "#{secs_or_ms(r['cpu_ns'].to_f)} (#{format('%.0f MiB', r['peak_rss_kb'].to_f / 1024)})" : "—"
      end]
    end)
    puts "\nEvery export identical to v4.2.5's at the same hour: #{churn.all? { |r| r['result'] == 'identical' }} (#{churn.size} exports; v4.2.5's counter lines checked against the workload's own totals)."
  end
end

if (hourly = read(dir, "fold-hourly.csv"))
  puts "\n### The fold's own cost over the churn (run by the app once per recycle)\n\n"
  rows = %w[list-once-fold poc-fold].map do |arm|
    rs = hourly.select { |r| r["arm"] == arm }
    next if rs.empty?
    cpu = rs.map { |r| r["cpu_ns"].to_f }
    again = folds.select { |r| r["arm"] == arm && r["point"].end_with?("again") }.map { |r| r["cpu_ns"].to_f }
    [arm, rs.size, secs_or_ms(cpu.sum), ms(median(cpu)), ms(cpu.max), rs.sum { |r| r["files_folded"].to_i },
     again.empty? ? "—" : "#{ms(median(again))} (max #{ms(again.max)})"]
  end.compact
  puts table(["option", "folds", "CPU total", "CPU median", "CPU max", "files folded", "a fold with nothing to fold (median of samples)"], rows)
end

if (side = read(dir, "sidecar.csv"))
  puts "\n## promlab's sidecar on the churn's last stores (options_sidecar.sh)\n\n"
  puts "One-shot `promlab export` (median of 3; CPU = user + sys of the process, 10 ms resolution) and `promlab serve --store` " \
       "(the first scrape, then the median of 5 warm ones; CPU = the server's ticks during the scrape).\n\n"
  stores = { "per-metric" => "one file per metric and process", "per-metric-folded" => "… folded",
             "poc" => "one file per process (PoC)", "poc-folded" => "… folded" }
  rows = stores.map do |s, label|
    rs = side.select { |r| r["store"] == s }
    next if rs.empty?
    cell = lambda do |mode, strategies, reps|
      x = rs.select { |r| r["mode"] == mode && r["strategies"] == strategies && reps.include?(r["rep"].to_i) }
      format("%.3f s wall, %.2f s CPU", median(x.map { |r| r["wall_s"].to_f }), median(x.map { |r| r["cpu_s"].to_f }))
    end
    [label, cell.("export", "none", 1..3), cell.("export", "default", 1..3), cell.("serve", "default", [0]),
     cell.("serve", "default", 1..5), format("%.0f MiB", rs.map { |r| r["peak_rss_kb"].to_f }.max / 1024),
     rs.all? { |r| r["result"] == "identical" } ? "all #{rs.size} identical" : "DIFFERENT"]
  end.compact
  puts table(["store", "export, baseline strategies", "export, default strategies", "serve: first scrape",
              "serve: warm scrape", "peak RSS", "bytes vs client_ruby 4.2.5"], rows)
end
