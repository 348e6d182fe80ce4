//! A regular file or block device, driven through the poller's io_uring with
//! O_DIRECT and fixed (registered) buffers.

use super::FixedBuf;
use io_uring::{opcode, squeue, types};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// An open file or block device.
pub struct FileBackend {
    file: File,
    path: String,
    direct: bool,
    block_device: bool,
    size: u64,
    writable: bool,
}

impl FileBackend {
    /// Opens `path` (creating a file of `create_size` bytes if it is missing)
    /// with O_DIRECT when the file system allows `block_size`-aligned direct
    /// I/O, and through the page cache otherwise.
    pub fn open(
        path: &Path,
        create_size: Option<u64>,
        block_size: u32,
        read_only: bool,
    ) -> io::Result<Self> {
        if !path.exists() {
            let Some(size) = create_size else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "{} does not exist; give the namespace a size to create it",
                        path.display()
                    ),
                ));
            };
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let f = OpenOptions::new().write(true).create_new(true).open(path)?;
            f.set_len(size)?;
            tracing::info!(path = %path.display(), size, "created backing file");
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!read_only);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let mut file = open(true)?;
        let mut direct = probe_direct(&file, block_size);
        if !direct {
            tracing::warn!(
                path = %path.display(),
                block_size,
                "O_DIRECT with {block_size}-byte alignment is not possible here; serving through the page cache"
            );
            file = open(false)?;
        }
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        let size = if block_device {
            device_size(&file)?
        } else {
            meta.len()
        };
        if size == 0 {
            direct = false;
        }
        Ok(FileBackend {
            file,
            path: path.display().to_string(),
            direct,
            block_device,
            size,
            writable: !read_only,
        })
    }

    /// Size in bytes when opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Size in bytes now.
    pub fn current_size(&self) -> io::Result<u64> {
        if self.block_device {
            device_size(&self.file)
        } else {
            Ok(self.file.metadata()?.len())
        }
    }

    /// Whether the file was opened for writing.
    pub fn writable(&self) -> bool {
        self.writable
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.file.as_raw_fd())
    }

    pub fn read(&self, offset: u64, buf: FixedBuf) -> squeue::Entry {
        opcode::ReadFixed::new(self.fd(), buf.ptr, buf.len as u32, buf.index)
            .offset(offset)
            .build()
    }

    pub fn write(&self, offset: u64, buf: FixedBuf, fua: bool) -> squeue::Entry {
        let flags = if fua { libc::RWF_DSYNC } else { 0 };
        opcode::WriteFixed::new(self.fd(), buf.ptr, buf.len as u32, buf.index)
            .offset(offset)
            .rw_flags(flags)
            .build()
    }

    pub fn flush(&self) -> squeue::Entry {
        opcode::Fsync::new(self.fd())
            .flags(types::FsyncFlags::DATASYNC)
            .build()
    }

    /// Punches a hole (deallocate; a discard on block devices) or zeroes the
    /// range in place. Both leave the range reading as zeroes.
    pub fn zero(&self, offset: u64, len: u64, deallocate: bool) -> squeue::Entry {
        let mode = if deallocate {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        opcode::Fallocate::new(self.fd(), len)
            .offset(offset)
            .mode(mode)
            .build()
    }

    /// fdatasync, blocking.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    pub fn describe(&self) -> String {
        format!(
            "{} {} ({})",
            if self.block_device {
                "block device"
            } else {
                "file"
            },
            self.path,
            if self.direct {
                "O_DIRECT"
            } else {
                "page cache"
            }
        )
    }
}

/// Whether an aligned O_DIRECT read of one block works on this file.
fn probe_direct(file: &File, block_size: u32) -> bool {
    let Ok(mut buf) = memmap2::MmapMut::map_anon(4096) else {
        return false;
    };
    match file.read_at(&mut buf[..block_size as usize], 0) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::EINVAL),
    }
}

// BLKGETSIZE64 (linux/fs.h: _IOR(0x12, 114, size_t)): a block device's size in bytes.
nix::ioctl_read!(blk_get_size64, 0x12, 114, u64);

/// Size of a block device in bytes (BLKGETSIZE64).
fn device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
    unsafe { blk_get_size64(file.as_raw_fd(), &mut size) }.map_err(io::Error::from)?;
    Ok(size)
}
