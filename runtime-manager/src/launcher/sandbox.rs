//! Confining local workers: bubblewrap (`bwrap`) gives each worker its own
//! user, PID, mount, IPC and UTS namespaces. Inside, the worker and its commands are an
//! unprivileged user with no capabilities; they see `/usr` and `/etc` read-only, a
//! private `/tmp`, `/proc` of their own PID namespace (no other process of the machine:
//! not the manager, not the brain, not another worker), and of the workspaces only their
//! own, the one writable place. The network is the host's (the worker dials the brain),
//! unless the launcher gives the worker its egress proxy: then a namespace of its own
//! with only loopback, and two sockets bound in as its only way out (`local_egress.rs`).
//!
//! A manager running as root starts `bwrap` as [`SANDBOX_UID`] (its workspace is handed
//! to that user): inside a user namespace a process keeps its real uid for file access,
//! so root mapped to an unprivileged uid would still open root's own files through the
//! bind mounts. As another user it opens only what is readable to everyone.
//!
//! `bwrap` runs under `setsid`: a new session, so no command reaches the terminal of the
//! manager (`TIOCSTI`), and a new process group holding `bwrap`, its init and the worker,
//! which the launcher signals as a whole.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The uid and gid confined workers run as when the manager is root (`nobody`), and the
/// uid they see themselves as inside, whoever started them.
pub const SANDBOX_UID: u32 = 65534;

/// How the local launcher runs workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Confinement {
    /// Under `bwrap`, in namespaces of their own.
    Confined { bwrap: PathBuf, setsid: PathBuf },
    /// Namespaces cannot be made here (the reason): every launch is refused.
    Unavailable(String),
    /// As the manager's user, beside each other (`RUNTIME_MANAGER_LOCAL_UNCONFINED`,
    /// development only): a worker's commands read every other workspace and every
    /// process environment of that user.
    Unconfined,
}

impl Confinement {
    /// `Unconfined` when asked for; else `Confined` if `bwrap` is on `PATH` and makes its
    /// namespaces here (tried once, with `/bin/true`), `Unavailable` otherwise.
    pub fn detect(unconfined: bool) -> Self {
        if unconfined {
            return Self::Unconfined;
        }
        let (Some(bwrap), Some(setsid)) = (on_path("bwrap"), on_path("setsid")) else {
            return Self::Unavailable(
                "bwrap or setsid is not on PATH (install bubblewrap and util-linux)".into(),
            );
        };
        let mut probe = std::process::Command::new(&bwrap);
        probe
            .args(NAMESPACES)
            .args(["--ro-bind", "/", "/", "--proc", "/proc", "--", "true"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        if running_as_root() {
            probe.uid(SANDBOX_UID).gid(SANDBOX_UID);
        }
        match probe.output() {
            Ok(out) if out.status.success() => Self::Confined { bwrap, setsid },
            Ok(out) => Self::Unavailable(format!(
                "bwrap cannot make namespaces here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Self::Unavailable(format!("bwrap cannot be run: {e}")),
        }
    }
}

/// The namespaces and the identity inside, for the probe and the workers alike.
const NAMESPACES: [&str; 9] = [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--uid",
    "65534",
    "--gid",
    "65534",
];

/// `bwrap`'s arguments for a worker `worker_bin` whose workspace is `workspace` (both
/// absolute); the worker itself is the last one. With `egress` (a directory of the
/// session's sockets), a network namespace of its own with only loopback, the directory
/// bound in: the worker's only way out (W14).
pub fn bwrap_args(worker_bin: &Path, workspace: &Path, egress: Option<&Path>) -> Vec<OsString> {
    let s = OsStr::new;
    let mut args: Vec<OsString> = NAMESPACES.iter().map(OsString::from).collect();
    if egress.is_some() {
        args.push(OsString::from("--unshare-net"));
    }
    let mut push = |items: &[&OsStr]| args.extend(items.iter().map(OsString::from));
    push(&[s("--hostname"), s("worker")]);
    push(&[s("--ro-bind"), s("/usr"), s("/usr")]);
    // Merged /usr keeps these as links into it; older layouts as directories.
    for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        match std::fs::read_link(dir) {
            Ok(target) => push(&[s("--symlink"), target.as_os_str(), s(dir)]),
            Err(_) => push(&[s("--ro-bind-try"), s(dir), s(dir)]),
        }
    }
    push(&[s("--ro-bind"), s("/etc"), s("/etc")]);
    // Where /etc/resolv.conf points on systemd-resolved hosts.
    let resolved = s("/run/systemd/resolve");
    push(&[s("--ro-bind-try"), resolved, resolved]);
    push(&[
        s("--proc"),
        s("/proc"),
        s("--dev"),
        s("/dev"),
        s("--tmpfs"),
        s("/tmp"),
    ]);
    let (bin, workspace) = (worker_bin.as_os_str(), workspace.as_os_str());
    push(&[s("--ro-bind"), bin, bin]);
    push(&[s("--bind"), workspace, workspace, s("--chdir"), workspace]);
    // After the private `/tmp`, which would hide it when the workspaces are under `/tmp`.
    if let Some(dir) = egress {
        push(&[s("--bind"), dir.as_os_str(), dir.as_os_str()]);
    }
    push(&[s("--"), bin]);
    args
}

/// Whether this process runs as root. The owner of `/proc/self` is the effective uid
/// (this process is dumpable), which spares an `unsafe` call to `geteuid`.
pub fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The process to ask to stop first: the worker itself. Under `bwrap` it is the
/// grandchild of the launched process (`bwrap`, its init, the worker); `bwrap` dies of a
/// SIGTERM at once and takes the sandbox with it, before the worker could say goodbye.
pub fn innermost(pid: u32) -> u32 {
    let mut current = pid;
    for _ in 0..2 {
        let comm = std::fs::read_to_string(format!("/proc/{current}/comm")).unwrap_or_default();
        if comm.trim_end() != "bwrap" {
            break;
        }
        let children = std::fs::read_to_string(format!("/proc/{current}/task/{current}/children"))
            .unwrap_or_default();
        match children
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
        {
            Some(child) => current = child,
            None => break,
        }
    }
    current
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_is_the_last_argument_and_only_its_workspace_is_writable() {
        let args = bwrap_args(Path::new("/opt/worker"), Path::new("/ws/s1"), None);
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(args.last(), Some(&"/opt/worker"));
        let writable: Vec<_> = args
            .windows(3)
            .filter(|w| w[0] == "--bind")
            .map(|w| (w[1], w[2]))
            .collect();
        assert_eq!(writable, [("/ws/s1", "/ws/s1")]);
        for ns in ["--unshare-user", "--unshare-pid", "--proc"] {
            assert!(args.contains(&ns), "{ns}");
        }
        assert!(!args.contains(&"--share-net") && !args.contains(&"--bind-try"));
        assert!(!args.contains(&"--unshare-net"));

        let args = bwrap_args(
            Path::new("/opt/worker"),
            Path::new("/ws/s1"),
            Some(Path::new("/ws/s1.egress")),
        );
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert!(args.contains(&"--unshare-net"));
        let writable: Vec<_> = args
            .windows(3)
            .filter(|w| w[0] == "--bind")
            .map(|w| (w[1], w[2]))
            .collect();
        assert_eq!(
            writable,
            [("/ws/s1", "/ws/s1"), ("/ws/s1.egress", "/ws/s1.egress")]
        );
        assert_eq!(args.last(), Some(&"/opt/worker"));
    }

    #[test]
    fn asking_for_unconfined_skips_the_probe_and_a_plain_process_is_its_own_innermost() {
        assert_eq!(Confinement::detect(true), Confinement::Unconfined);
        assert_eq!(innermost(std::process::id()), std::process::id());
    }
}
