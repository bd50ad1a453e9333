# A DirectFileStore names its files by the pid that writes them, and the fixtures' pids are
# ordinary numbers this machine also hands out. A process whose pid is one of them would write
# its registration zeros into that process's files (symlinks into the fixtures) and then delete
# them, so instead it does the work in a child, whose pid differs; repeated until the store
# holds no file of the working process's pid. The parent exits with the child's status.
def work_under_a_pid_the_store_lacks(dir)
  while own_store_files(dir).any?
    child = Process.fork
    next if child.nil?

    Process.wait(child)
    exit($?.exitstatus || 1)
  end
end

# This process's own files in the store: `metric_<name>___<pid>.bin`, or `metrics___<pid>.bin`
# in the one-file-per-process layout of the poc_file_per_process branch.
def own_store_files(dir)
  Dir.glob(File.join(dir, "metric{_*,s}___#{Process.pid}.bin"))
end
