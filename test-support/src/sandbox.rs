//! Pids across the local launcher's PID namespaces: the commands of a confined worker see
//! pids of their own (`echo $$`), and a test that checks them from outside needs the
//! host's.

/// The host pid of the process whose pid in its own namespace is `inner` and which
/// descends from `ancestor` (a worker's `bwrap`, as its `worker_ref` names it). A process
/// in the host's namespace is its own `inner`. `None` once it is gone.
pub fn host_pid(ancestor: u32, inner: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            field(*pid, "NSpid:").and_then(|ids| ids.split_whitespace().last()?.parse().ok())
                == Some(inner)
                && descends(*pid, ancestor)
        })
}

fn descends(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        match field(pid, "PPid:").and_then(|p| p.trim().parse().ok()) {
            Some(parent) if parent > 0 => pid = parent,
            _ => return false,
        }
    }
    false
}

fn field(pid: u32, name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(name).map(str::to_owned))
}
