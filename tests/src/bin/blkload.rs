//! blkload: a small O_DIRECT load generator for block devices (io_uring,
//! fixed queue depth), used by the VM suite to measure /dev/nvmeXnY from
//! different targets with the same tool where fio would be too heavy.
//!
//! blkload DEVICE [--rw randread|read|randwrite|write] [--bs 4k] [--qd 32] [--runtime 10s]

use io_uring::{opcode, types, IoUring};
use rdmablk::bench::{us, Histogram};
use rdmablk_common::units::{parse_duration, parse_size};
use rdmablk_tests::args::Flags;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

fn main() {
    if let Err(e) = run() {
        eprintln!("blkload: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let flags = Flags::from_env();
    let dev = flags
        .positional(0)
        .ok_or("usage: blkload DEVICE [--rw R] [--bs N] [--qd N] [--runtime D]")?
        .to_string();
    let rw = flags.value("--rw", "randread");
    let bs = parse_size(&flags.value("--bs", "4k")).map_err(|e| e.to_string())? as usize;
    let qd: usize = flags.number("--qd", "32")?;
    let runtime = parse_duration(&flags.value("--runtime", "10s")).map_err(|e| e.to_string())?;
    let write = rw.ends_with("write");
    let random = rw.starts_with("rand");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(&dev)
        .map_err(|e| format!("{dev}: {e}"))?;
    let size = {
        let mut s: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through a valid pointer.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), 0x8008_1272, &mut s as *mut u64) };
        if r < 0 {
            file.metadata().map_err(|e| e.to_string())?.len()
        } else {
            s
        }
    };
    let units = size / bs as u64;
    if units == 0 || qd == 0 {
        return Err("device smaller than one block, or --qd 0".into());
    }
    let mut buf = memmap2::MmapMut::map_anon(bs * qd).map_err(|e| e.to_string())?;
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let mut ring = IoUring::new(qd.next_power_of_two() as u32 * 2).map_err(|e| e.to_string())?;
    let mut started = vec![Instant::now(); qd];
    let mut next_seq = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut hist = Histogram::default();
    let mut pick = || {
        if random {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % units
        } else {
            next_seq = (next_seq + 1) % units;
            next_seq
        }
    };
    let fd = types::Fd(file.as_raw_fd());
    let submit = |ring: &mut IoUring, slot: usize, unit: u64, base: *mut u8| {
        let ptr = base.wrapping_add(slot * bs);
        let e = if write {
            opcode::Write::new(fd, ptr, bs as u32)
                .offset(unit * bs as u64)
                .build()
        } else {
            opcode::Read::new(fd, ptr, bs as u32)
                .offset(unit * bs as u64)
                .build()
        };
        // SAFETY: the buffer slot belongs to this I/O until its completion.
        unsafe { ring.submission().push(&e.user_data(slot as u64)) }.expect("ring sized for qd");
    };
    let base = buf.as_mut_ptr();
    let begin = Instant::now();
    for (slot, at) in started.iter_mut().enumerate() {
        *at = Instant::now();
        submit(&mut ring, slot, pick(), base);
    }
    let (mut ios, mut inflight) = (0u64, qd);
    while inflight > 0 {
        ring.submit_and_wait(1).map_err(|e| e.to_string())?;
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (slot, res) in done {
            if res < 0 {
                return Err(format!(
                    "I/O error: {}",
                    std::io::Error::from_raw_os_error(-res)
                ));
            }
            hist.record(started[slot].elapsed().as_nanos() as u64);
            ios += 1;
            if begin.elapsed() < runtime {
                started[slot] = Instant::now();
                submit(&mut ring, slot, pick(), base);
            } else {
                inflight -= 1;
            }
        }
    }
    let secs = begin.elapsed().max(Duration::from_micros(1)).as_secs_f64();
    println!(
        "blkload {dev} {rw} bs={bs} qd={qd}: {:.0} IOPS {:.1} MiB/s lat_us p50 {} p99 {} p99.9 {}",
        ios as f64 / secs,
        ios as f64 * bs as f64 / secs / (1 << 20) as f64,
        us(hist.quantile(0.5)),
        us(hist.quantile(0.99)),
        us(hist.quantile(0.999))
    );
    Ok(())
}
