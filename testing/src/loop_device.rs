//! A real block device for tests: a loop device over a small image with one partition, so
//! the kernel shows a device (`loopN`) with a child (`loopNp1`) that tests can attach and
//! detach, as a USB stick is plugged and pulled. Needs root, `losetup` (Debian's mount) and
//! `partx` (util-linux), as CI has.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over an image of its own; detached on drop.
pub struct LoopDevice {
    image: PathBuf,
    device: Option<String>,
    _dir: tempfile::TempDir,
}

impl LoopDevice {
    /// A 4 MiB image with an MBR naming one partition; nothing attached yet.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let image = dir.path().join("disk.img");
        let mut bytes = vec![0u8; 4 << 20];
        let entry = &mut bytes[446..462];
        entry[4] = 0x83; // Linux
        entry[8..12].copy_from_slice(&2048u32.to_le_bytes()); // first sector
        entry[12..16].copy_from_slice(&4096u32.to_le_bytes()); // sectors
        bytes[510] = 0x55;
        bytes[511] = 0xaa;
        std::fs::write(&image, bytes).expect("the image written");
        LoopDevice {
            image,
            device: None,
            _dir: dir,
        }
    }

    /// The image file (the device's `loop/backing_file` while attached).
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Attaches the image (with its partition) and returns the device node, `/dev/loopN`.
    pub fn attach(&mut self) -> String {
        let output = Command::new("losetup")
            .args(["--find", "--show", "--partscan"])
            .arg(&self.image)
            .output()
            .expect("losetup runs");
        assert!(
            output.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let device = String::from_utf8(output.stdout)
            .expect("losetup prints a path")
            .trim()
            .to_string();
        self.device = Some(device.clone());
        // Kernels without the MBR parser (this project's CI machines) scan nothing: add the
        // partition through BLKPG, as partx does.
        let name = Self::kernel_name(&device);
        if !Path::new(&format!("/sys/block/{name}/{name}p1")).exists() {
            let status = Command::new("partx").args(["-a", &device]).status();
            assert!(status.expect("partx runs").success(), "partx -a {device}");
        }
        device
    }

    /// Detaches it (its partition goes with it); nothing if not attached.
    pub fn detach(&mut self) {
        if let Some(device) = self.device.take() {
            let status = Command::new("losetup").args(["-d", &device]).status();
            assert!(
                status.expect("losetup runs").success(),
                "losetup -d {device}"
            );
        }
    }

    /// The udev rule selecting this image's loop device and no other.
    pub fn udev_rule(&self) -> String {
        format!(
            r#"SUBSYSTEM=="block", KERNEL=="loop*", ATTR{{loop/backing_file}}=="{}""#,
            self.image.display()
        )
    }

    /// `/dev/loop3` -> `loop3`.
    pub fn kernel_name(device: &str) -> &str {
        device.trim_start_matches("/dev/")
    }
}

impl Default for LoopDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(device) = self.device.take() {
            let _ = Command::new("losetup").args(["-d", &device]).status();
        }
    }
}
