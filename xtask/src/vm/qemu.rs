//! The QEMU machine one boot runs: its size, accelerator and kernel command line (from
//! the `CODECAGE_VM_*` variables), and the command line that starts it.

use super::lanes::Cgroups;
use super::run::ControlDir;
use super::Image;
use crate::host::own_group_and_die_with_parent;
use anyhow::Result;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Guest memory unless `CODECAGE_VM_MEM` says otherwise: the `ci` profile lets one sandbox
/// hold 2 GiB, and a lane runs its tests in parallel (QEMU touches only what the guest uses).
const DEFAULT_MEM_MIB: u64 = 4096;
/// Guest CPUs unless `CODECAGE_VM_CPUS` says otherwise: the host's, at most this many.
const MAX_DEFAULT_CPUS: u64 = 4;
/// How long the command may take to start unless `CODECAGE_VM_BOOT_TIMEOUT` says
/// otherwise (boots take 4-9 s under TCG; see `xtask/vm/README.md`).
const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// The kernel command line, to which the lane's cgroup layout adds its arguments
/// (`cgroup_no_v1=all` for pure v2) and `CODECAGE_VM_APPEND` its own. `panic=-1` with
/// QEMU's `-no-reboot` ends QEMU on a guest panic.
const KERNEL_CMDLINE: &str = "console=ttyS0 panic=-1 oops=panic quiet loglevel=3 \
                              mitigations=off random.trust_cpu=on";

/// The 9p tags of the control share and of the project share (see `guest-init.sh`).
pub const CONTROL_TAG: &str = "codecage.ctl";
pub const SHARE_TAG: &str = "codecage.share";
/// The virtio-serial port that carries the job's output.
pub const OUT_PORT: &str = "codecage.out";

/// The machine, as the environment asks for it.
pub struct Machine {
    /// `kvm` or `tcg`, for messages.
    pub accel: &'static str,
    accel_args: Vec<String>,
    pub mem_mib: u64,
    pub cpus: u64,
    pub boot_timeout: Duration,
    append: String,
}

impl Machine {
    /// The machine for a guest with the `cgroups` layout.
    pub fn from_env(cgroups: Cgroups) -> Machine {
        let (accel, accel_args) = accel_args();
        let host_cpus = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
        Machine {
            accel,
            accel_args,
            mem_mib: env_u64("CODECAGE_VM_MEM", DEFAULT_MEM_MIB),
            cpus: env_u64("CODECAGE_VM_CPUS", host_cpus.min(MAX_DEFAULT_CPUS)),
            boot_timeout: Duration::from_secs(env_u64(
                "CODECAGE_VM_BOOT_TIMEOUT",
                DEFAULT_BOOT_TIMEOUT.as_secs(),
            )),
            append: format!(
                "{} {}",
                cgroups.kernel_args(),
                std::env::var("CODECAGE_VM_APPEND").unwrap_or_default()
            ),
        }
    }
}

/// The QEMU command for one boot of `image`: no display, no network, the root disk as a
/// throw-away snapshot, the two 9p shares, the output port and the console in files.
/// It starts in its own process group and dies with xtask.
pub fn command(
    qemu: &Path,
    image: &Image,
    machine: &Machine,
    ctl: &ControlDir,
    share: &Path,
) -> Result<Command> {
    let append = format!("{KERNEL_CMDLINE} {}", machine.append);
    let mut cmd = Command::new(qemu);
    cmd.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    .args(["-machine", "q35"])
    .args(&machine.accel_args)
    .args(["-m", &machine.mem_mib.to_string()])
    .args(["-smp", &machine.cpus.to_string()])
    .arg("-kernel")
    .arg(&image.vmlinux)
    .arg("-initrd")
    .arg(&image.initrd)
    .args(["-append", append.trim_end()])
    .arg("-drive")
    .arg(format!(
        "file={},format=raw,if=virtio,snapshot=on,cache=unsafe",
        qemu_path(&image.rootfs)
    ))
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag={CONTROL_TAG},security_model=none",
        qemu_path(ctl.dir.path())
    ))
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag={SHARE_TAG},security_model=none,multidevs=remap",
        qemu_path(share)
    ))
    .args(["-device", "virtio-rng-pci"])
    .args(["-device", "virtio-serial-pci,id=vser"])
    .arg("-chardev")
    .arg(format!("file,id=out,path={}", qemu_path(&ctl.output)))
    .args([
        "-device",
        &format!("virtserialport,bus=vser.0,chardev=out,name={OUT_PORT}"),
    ])
    .arg("-serial")
    .arg(format!("file:{}", qemu_path(&ctl.console)))
    .stdin(Stdio::null());
    // stdout and stderr share one open file (and so its offset).
    let log = fs::File::create(&ctl.qemu_log)?;
    cmd.stdout(log.try_clone()?).stderr(log);
    own_group_and_die_with_parent(&mut cmd);
    Ok(cmd)
}

/// QEMU option values escape a comma by doubling it.
fn qemu_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// KVM only when it can really run a stock kernel: /dev/kvm usable *and* the
/// CPU shows vmx/svm. (On PVM-backed hosts /dev/kvm exists, but a stock
/// kernel crawls there; TCG is much faster.) `CODECAGE_VM_ACCEL=kvm|tcg`
/// overrides, `CODECAGE_VM_CPU` sets the CPU model.
fn accel_args() -> (&'static str, Vec<String>) {
    let forced = std::env::var("CODECAGE_VM_ACCEL").unwrap_or_default();
    let kvm = match forced.as_str() {
        "kvm" => true,
        "tcg" => false,
        _ => {
            let usable = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .is_ok();
            let flags = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let virt = flags
                .lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
            usable && virt
        }
    };
    let (name, accel, cpu) = if kvm {
        ("kvm", "kvm", "host")
    } else {
        // Nehalem covers x86-64-v2 (SSE4.2, POPCNT), more than what
        // Debian and rustc target by default. Measured against `-cpu max`
        // (which adds AVX/AVX2, that glibc then prefers and TCG emulates
        // slowly): boot 4.7-5.5 s instead of 5.6-9 s, exec ~30% faster.
        // Binaries built for x86-64-v3 need CODECAGE_VM_CPU=max.
        ("tcg", "tcg,thread=multi", "Nehalem")
    };
    let cpu = std::env::var("CODECAGE_VM_CPU").unwrap_or_else(|_| cpu.to_string());
    (
        name,
        vec!["-accel".into(), accel.into(), "-cpu".into(), cpu],
    )
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
