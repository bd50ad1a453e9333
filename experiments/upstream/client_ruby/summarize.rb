# Summary of a client_ruby run.sh results directory, as markdown on stdout.
#   ruby summarize.rb RESULTS_DIR PROMLAB_RUST_RESULTS_DIR ELAPSED_SECONDS
require 'csv'

out, rust_dir, elapsed = ARGV
def table(header, rows)
  ["| #{header.join(' | ')} |", "| #{header.map { '---' }.join(' | ')} |",
   *rows.map { |r| "| #{r.join(' | ')} |" }].join("\n")
end
def median(xs)
  s = xs.sort
  s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
end
def fmt_ns(ns)
  if ns >= 1e9 then format('%.2f s', ns / 1e9)
  elsif ns >= 1e6 then format('%.1f ms', ns / 1e6)
  elsif ns >= 1e3 then format('%.1f µs', ns / 1e3)
  else format('%d ns', ns) end
end

machine = File.read(File.join(out, 'machine.txt'))
puts "# client_ruby patches: rspec, byte identity#{File.exist?(File.join(out, 'timings.csv')) ? ', timings' : ''}"
puts
puts "Written by `experiments/upstream/client_ruby/run.sh` in #{elapsed} s."
puts
puts '```'
puts machine
puts '```'
puts

rspec = CSV.read(File.join(out, 'rspec.csv'), headers: true)
revs = rspec.map { |r| r['revision'] }.uniq
sets = rspec.map { |r| r['set'] }.uniq
puts '## rspec (client_ruby\'s own suite plus the patches\' examples)'
puts
puts table(['set', *revs], sets.map { |s|
  [s, *revs.map { |rev|
    r = rspec.find { |x| x['revision'] == rev && x['set'] == s }
    r ? "#{r['examples']} examples, #{r['failures']} failures" : '—'
  }]
})
puts

ident_file = File.join(out, 'identity.csv')
ident = File.exist?(ident_file) ? CSV.read(ident_file, headers: true) : []
cases = ident.map { |r| r['case'] }.uniq
puts '## Byte identity (Formats::Text.marshal over a DirectFileStore at each fixture store)'
puts
puts "Reference: each case's `expected.prom` (Ruby's own exposition); `mixed-all-types` (both " \
     'all-types stores in one directory) has none, so its reference is the unpatched revision\'s output. ' \
     'Cells: result, export wall time of one `ruby export.rb` process (ms).'
puts
many_file = File.join(out, 'identity-many.csv')
if File.exist?(many_file)
  many = CSV.read(many_file, headers: true)
  counts = many.group_by { |r| r['result'] }.transform_values(&:size)
  puts "Many-file stores (`promlab scenario-store`): every timed export's exposition compared with the " \
       "scenario's `expected.prom` (the reference exporter's answer): " \
       "#{counts.map { |result, n| "#{n} #{result}" }.join(', ')} " \
       "(#{many.map { |r| r['case'] }.uniq.join(', ')}; #{many.map { |r| r['set'] }.uniq.join(', ')})."
  puts
end
revs.each do |rev|
  next if ident.none? { |r| r['revision'] == rev }
  puts "### #{rev}"
  puts
  puts table(['set', *cases], sets.map { |s|
    [s, *cases.map { |c|
      r = ident.find { |x| x['revision'] == rev && x['set'] == s && x['case'] == c }
      r ? "#{r['result']} (#{r['export_ms']})" : '—'
    }]
  })
  puts
end

timings_file = File.join(out, 'timings.csv')
exit 0 unless File.exist?(timings_file)
t = CSV.read(timings_file, headers: true)
realized = {}
puts '## Timings (medians over interleaved rounds; speed-up = unpatched median / arm median)'
puts
puts 'CPU time of the measured process (`CLOCK_PROCESS_CPUTIME_ID`) is the primary figure: the two ' \
     'cores were shared with other work, which inflates wall time unevenly; wall-time medians are ' \
     'beside it. Export: one `ruby bench.rb export` process per round and arm; the seed repro is the ' \
     'median of 3 marshals in that process, the large case 1 marshal. Write: 1,000 warm-up steps, ' \
     'then 20,000 timed steps of Histogram#observe + Counter#increment with one 195-character label value.'
puts
t.group_by { |r| [r['revision'], r['task']] }.each do |(rev, task), rows|
  by_arm = rows.group_by { |r| r['arm'] }
  base_cpu = median(by_arm.fetch('unpatched').map { |r| r['cpu_ns'].to_f })
  base_wall = median(by_arm.fetch('unpatched').map { |r| r['wall_ns'].to_f })
  unit = rows.first['unit']
  puts "### #{rev}: #{task}"
  puts
  puts table(['arm', 'rounds', "CPU median#{unit == 'steps' ? ' per step' : ''}", 'CPU min–max', 'CPU speed-up',
              'wall median', 'wall speed-up'],
             by_arm.map { |arm, rs|
               cpu = rs.map { |r| r['cpu_ns'].to_f }
               wall = rs.map { |r| r['wall_ns'].to_f }
               m = median(cpu)
               realized[[rev, task, arm]] = base_cpu / m
               [arm, cpu.size, fmt_ns(m), "#{fmt_ns(cpu.min)}–#{fmt_ns(cpu.max)}", format('%.2f×', base_cpu / m),
                fmt_ns(median(wall)), format('%.2f×', base_wall / median(wall))]
             })
  puts
end

# Predicted (promlab's ablation in Rust, each strategy alone vs baseline) against realized in Ruby
rust = {}
{ 'seed-repro' => 'seed-repro.csv', 'large-ruby' => 'large-ruby.csv',
  'write-long-label' => 'write-long-label.csv' }.each do |scenario, file|
  path = File.join(rust_dir, file)
  next unless File.exist?(path)
  CSV.read(path, headers: true).each { |r| rust[[scenario, r['arm']]] = r['speedup_vs_baseline'].to_f }
end
rows = []
map = [
  ['decode-once', 'decode-once', :export], ['single-read', 'single-read', :export],
  ['fast-unescape', 'fast-unescape', :export], ['key-cache', 'key-cache', :write],
  ['increment-once', 'increment-once', :write],
  ['all (export: single-read + decode-once + fast-unescape)', 'all-prerender', :export, 'all'],
  ['all (write: key-cache + increment-once)', 'all-mmap-store', :write, 'all'],
]
map.each do |label, rust_arm, stage, ruby_arm|
  ruby_arm ||= rust_arm
  if stage == :export
    [['seed-repro', 'export seed-repro'], ['large-ruby', 'export large-v5-uri']].each do |scen, task|
      revs.each do |rev|
        task_name = scen == 'seed-repro' ? realized.keys.find { |k| k[0] == rev && k[1].start_with?('export seed-repro') }&.at(1) : task
        r = realized[[rev, task_name, ruby_arm]]
        next unless r
        p = rust[[scen, rust_arm]]
        rows << [label, "#{scen} (#{rev})", p ? format('%.2f×', p) : '—', format('%.2f×', r)]
      end
    end
  else
    revs.each do |rev|
      r = realized[[rev, 'write long label', ruby_arm]]
      next unless r
      p = rust[['write-long-label', rust_arm]]
      rows << [label, "write-long-label (#{rev})", p ? format('%.2f×', p) : '—', format('%.2f×', r)]
    end
  end
end
puts '## Predicted (promlab, Rust) vs realized (client_ruby, Ruby)'
puts
puts "Predicted: `speedup_vs_baseline` of the strategy's arm in `#{rust_dir.sub(%r{.*/experiments/}, 'experiments/')}` " \
     '(alone against promlab\'s baseline; for "all", the Rust arm with the same strategies: `all-prerender` for ' \
     'export, `all-mmap-store` for write). Realized: CPU-time speed-up from the tables above.'
puts
puts table(['strategy', 'workload', 'predicted (Rust)', 'realized (Ruby)'], rows)
