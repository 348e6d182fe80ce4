//! ublk front-end: a connected namespace as /dev/ublkbN. libublk does the
//! control path (add or recover the device, parameters, start, stop,
//! delete) on the calling thread; each ublk queue is served by the engine
//! of one NVMe I/O queue (see `driver`). The device is created with user
//! recovery: after a crash, the same command with `--ublk-id N` takes the
//! device over again and the I/O that waited is issued anew.

mod descriptors;
mod driver;

use super::keeper::{EngineSpec, Engines, Keeper, Until};
use crate::host::{Attachment, NamespaceInfo};
use driver::{QueueSetup, UblkDriver};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{sys, UblkFlags};
use nix::sys::signal::kill;
use nix::unistd::Pid;
use rdmablk_common::nvme::identify::oncs;
use rdmablk_common::spin::PollMode;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const CONTROL: &str = "/dev/ublk-control";
/// Largest request the device takes (and each tag's buffer).
const MAX_IO: usize = 512 << 10;

/// How the device is set up.
#[derive(Clone, Copy, Debug)]
pub struct UblkOptions {
    /// Device id (N of /dev/ublkbN); the kernel picks one when `None`.
    pub id: Option<u32>,
    pub queues: u16,
    pub depth: u16,
    pub ctrl_loss_tmo: Duration,
    /// How the queues' engines wait for work.
    pub poll: PollMode,
}

/// Fails at once when this kernel cannot create ublk devices.
pub fn check_available() -> Result<(), String> {
    if Path::new(CONTROL).exists() {
        return Ok(());
    }
    Err(format!(
        "--ublk: {CONTROL} is missing: load the kernel's ublk driver (modprobe ublk_drv; \
         Linux 6.0 or later), or serve the namespace with --nbd instead"
    ))
}

fn ublk_err(what: &str, e: libublk::UblkError) -> String {
    format!("ublk {what}: {e}")
}

/// A device that exists with `id`: what to do with it.
enum Existing {
    None,
    /// Its server died: take it over.
    Recover,
}

/// Looks at device `id`: left by a crashed server (recover it), served by a
/// live process (refuse), or dead (delete it so the id can be reused).
fn existing(id: u32) -> Result<Existing, String> {
    if !Path::new(&format!("/dev/ublkc{id}")).exists() {
        return Ok(Existing::None);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = UblkCtrl::new_simple(id as i32).map_err(|e| ublk_err("device lookup", e))?;
        let info = probe.dev_info();
        let pid_alive = info.ublksrv_pid > 0 && kill(Pid::from_raw(info.ublksrv_pid), None).is_ok();
        match info.state as u32 {
            sys::UBLK_S_DEV_QUIESCED | sys::UBLK_S_DEV_FAIL_IO => {
                tracing::info!(id, "ublk device left by a stopped server: recovering it");
                let r = probe
                    .start_user_recover()
                    .map_err(|e| ublk_err("start of recovery", e))?;
                if r < 0 {
                    return Err(format!(
                        "ublk device {id} cannot be recovered: {}",
                        std::io::Error::from_raw_os_error(-r)
                    ));
                }
                return Ok(Existing::Recover);
            }
            sys::UBLK_S_DEV_LIVE if pid_alive => {
                return Err(format!(
                    "/dev/ublkb{id} is in use by process {}; stop it or choose another --ublk-id",
                    info.ublksrv_pid
                ));
            }
            // A dying server: the kernel quiesces the device shortly.
            sys::UBLK_S_DEV_LIVE if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            _ => {
                tracing::info!(id, "removing a dead ublk device to reuse its id");
                let _ = probe.del_dev();
                return Ok(Existing::None);
            }
        }
    }
}

/// Sets the block device's parameters from the namespace.
fn set_params(d: &mut UblkDev, ns: &NamespaceInfo, max_io: usize, oncs_bits: u16) {
    d.set_default_params(ns.size_bytes());
    let shift = ns.block_size.trailing_zeros() as u8;
    let p = &mut d.tgt.params;
    p.basic.logical_bs_shift = shift;
    p.basic.physical_bs_shift = shift.max(12);
    p.basic.io_min_shift = shift;
    p.basic.io_opt_shift = shift.max(12);
    p.basic.max_sectors = (max_io >> 9) as u32;
    p.basic.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    if ns.read_only {
        p.basic.attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    let sectors_per_block = ns.block_size >> 9;
    if oncs_bits & (oncs::DSM | oncs::WRITE_ZEROES) != 0 {
        p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        p.discard.discard_granularity = ns.block_size;
        p.discard.max_discard_segments = 1;
        if oncs_bits & oncs::DSM != 0 {
            p.discard.max_discard_sectors = (1 << 30) >> 9; // 1 GiB per request
        }
        if oncs_bits & oncs::WRITE_ZEROES != 0 {
            // NLB is 16 bits.
            p.discard.max_write_zeroes_sectors = 65536 * sectors_per_block;
        }
    }
}

/// Serves the namespace of `att` as /dev/ublkbN until SIGINT/SIGTERM, over
/// all its paths, then deletes the device. A lost association is
/// re-established as for NBD; once no path has been usable for
/// ctrl-loss-tmo, waiting I/O fails and this errors. Signals must be
/// blocked in every thread.
pub fn serve(att: Attachment, o: UblkOptions) -> Result<(), String> {
    check_available()?;
    let ns = att.ns;
    let max_io = att
        .max_transfer()
        .min(MAX_IO)
        .max(ns.block_size as usize)
        .next_multiple_of(4096);
    let recover = match o.id {
        Some(id) => matches!(existing(id)?, Existing::Recover),
        None => false,
    };
    let queues = att.io_queues().min(o.queues).max(1);
    let depth = o.depth.clamp(1, att.queue_size().saturating_sub(1).max(1));
    let flags = sys::UBLK_F_USER_RECOVERY
        | sys::UBLK_F_USER_RECOVERY_REISSUE
        | sys::UBLK_F_CMD_IOCTL_ENCODE;
    let dev_flags = if recover {
        UblkFlags::UBLK_DEV_F_RECOVER_DEV
    } else {
        UblkFlags::UBLK_DEV_F_ADD_DEV
    };
    let ctrl = UblkCtrlBuilder::default()
        .name("rdmablk")
        .id(o.id.map_or(-1, |i| i as i32))
        .nr_queues(queues)
        .depth(depth)
        .io_buf_bytes(max_io as u32)
        .ctrl_flags(flags as u64)
        .dev_flags(dev_flags)
        .build()
        .map_err(|e| ublk_err("device creation", e))?;
    // A recovered device keeps its own geometry.
    let info = ctrl.dev_info();
    let (queues, depth, max_io) = (
        info.nr_hw_queues,
        info.queue_depth,
        info.max_io_buf_bytes as usize,
    );
    if max_io > att.max_transfer() {
        return Err(format!(
            "ublk device {} takes {max_io}-byte requests; this target's largest transfer is {} bytes",
            info.dev_id,
            att.max_transfer()
        ));
    }
    if queues > att.io_queues() {
        return Err(format!(
            "ublk device {} has {queues} queues; the target grants only {} I/O queues",
            info.dev_id,
            att.io_queues()
        ));
    }
    let oncs_bits = att.oncs();
    let dev = UblkDev::new(
        "rdmablk".into(),
        |d| {
            set_params(d, &ns, max_io, oncs_bits);
            Ok(())
        },
        &ctrl,
    )
    .map_err(|e| ublk_err("device setup", e))?;
    let cdev = dev.tgt.fds[0];
    let give_up = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let arena = (depth as usize * max_io).next_multiple_of(4 << 20) + (4 << 20);
    let mut keeper = Keeper::new(att, o.ctrl_loss_tmo);
    let spec = EngineSpec {
        queues,
        arena_bytes: arena,
        name: "ublk",
        poll: o.poll,
    };
    let engines = Engines::spawn(&keeper, spec, |q, _| {
        UblkDriver::new(QueueSetup {
            cdev,
            q_id: q as u16,
            depth,
            max_io,
            ns,
            ready: ready_tx.clone(),
            give_up: give_up.clone(),
            stop: stop.clone(),
        })
    })?;
    for _ in 0..queues {
        let (q, tid) = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "a ublk queue did not start".to_string())?;
        ctrl.configure_queue(&dev, q, tid)
            .map_err(|e| ublk_err("queue setup", e))?;
        dev.notify_buffer_registration_complete(false);
    }
    let r = ctrl.start_dev(&dev).map_err(|e| ublk_err("start", e))?;
    if r < 0 {
        return Err(format!(
            "ublk start: {}",
            std::io::Error::from_raw_os_error(-r)
        ));
    }
    let path = ctrl.get_bdev_path();
    println!("ready: {path}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    tracing::info!(device = %path, size = ns.size_bytes(), queues, depth, max_io, recovered = recover, "ublk device ready");

    keeper.publish(&path);
    let outcome = keeper.watch(&engines, Until::Signal("removing the ublk device"));
    if outcome.result.is_err() {
        give_up.store(true, Ordering::Release);
    }
    stop.store(true, Ordering::Release);
    engines.wake_all();
    // STOP_DEV waits for the requests in flight, then aborts the fetches:
    // the engines finish.
    if let Err(e) = ctrl.stop_dev() {
        tracing::warn!("ublk stop: {e}");
    }
    let failure = outcome.result.err().or(engines.join().0);
    drop(dev);
    match ctrl.del_dev() {
        Ok(r) if r < 0 => tracing::warn!("ublk delete: {}", std::io::Error::from_raw_os_error(-r)),
        Err(e) => tracing::warn!("ublk delete: {e}"),
        Ok(_) => tracing::info!(device = %path, "ublk device removed"),
    }
    for s in outcome.sessions {
        if let Err(e) = s.shutdown() {
            tracing::warn!("controller shutdown: {e}");
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
