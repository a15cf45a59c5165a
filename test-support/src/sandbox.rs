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

/// Ends every worker a runtime-manager launched into `workspaces`. The local launcher
/// detaches its workers on purpose (they outlive a manager's restart), so a test's workers
/// would outlive the test too, re-dialing its brain's port until their token expires and
/// reaching whatever a later test is given that port (a fake Kubernetes API server once
/// recorded such a dial as a request of its own). The launcher keeps a `<session>.pid` per
/// worker beside the workspaces; each names the leader of the worker's process group.
pub fn kill_workers_in(workspaces: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(workspaces) else {
        return;
    };
    for path in entries.filter_map(|entry| Some(entry.ok()?.path())) {
        if path.extension().is_none_or(|ext| ext != "pid") {
            continue;
        }
        let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
        else {
            continue;
        };
        // Only a live group led by that pid: a pid reused by another process is left alone.
        if process_group(pid) == Some(pid) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
    }
}

/// The process group of `pid`, the fifth field of `/proc/<pid>/stat` (after the command's
/// name in parentheses, which may itself hold spaces or parentheses).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}
