//! The fake driver root against the tools that read real ones: glibc's `ldconfig` (sonames, the
//! loader cache), and the stand-ins run from the root the way the node plugin runs them.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tessera_driver_root::ldcache::LdCache;
use tessera_fake_driver::layout::{
    self, Artifacts, BINARIES, FIRMWARE, LIBRARIES, Layout, NodeKind, Summary,
};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};

const NODE: &str = "gpu-node-7";

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn ldconfig() -> &'static str {
    ["/usr/sbin/ldconfig", "/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("glibc's ldconfig is needed to check sonames and the loader cache")
}

struct FakeNode {
    _dir: tempfile::TempDir,
    root: PathBuf,
    dev_root: PathBuf,
    inventory: GpuInventory,
    summary: Summary,
}

impl FakeNode {
    fn new(topology: &str, layout: Layout) -> FakeNode {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("driver");
        let dev_root = dir.path().join("dev-root");
        let inventory = MockSource::new(topology)
            .unwrap()
            .for_node(NODE)
            .inventory()
            .unwrap();
        layout::write_dev_root(&dev_root, &inventory, NodeKind::RegularFile).unwrap();
        let artifacts = Artifacts::in_dir(target_dir())
            .with_tool(env!("CARGO_BIN_EXE_tessera-fake-driver-tool"));
        let summary =
            layout::write_driver_root(&root, layout, NODE, &inventory, &dev_root, &artifacts)
                .unwrap();
        FakeNode {
            _dir: dir,
            root,
            dev_root,
            inventory,
            summary,
        }
    }

    fn library_dir(&self) -> PathBuf {
        self.root
            .join(self.summary.library_dir.strip_prefix("/").unwrap())
    }

    fn binary(&self, name: &str) -> PathBuf {
        self.root
            .join(self.summary.binary_dir.strip_prefix("/").unwrap())
            .join(name)
    }

    /// Runs a stand-in from the root as the node plugin does: the root's library directory on
    /// the loader's path.
    fn run(&self, binary: &str, args: &[&str], env: &[(&str, &Path)], stdin: &str) -> Output {
        let mut child = Command::new(self.binary(binary))
            .args(args)
            .env("LD_LIBRARY_PATH", self.library_dir())
            .env_remove("TESSERA_FAKE_NVML_TOPOLOGY")
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every library's ELF soname is the one its links name: ldconfig, reading copies of the files,
/// makes exactly the soname links the host layout has; each development link names the soname.
fn assert_ldconfig_makes_the_layouts_links(node: &FakeNode, version: &str) {
    let copies = tempfile::tempdir().unwrap();
    for library in LIBRARIES {
        let file = library.dir(Layout::Host).join(library.file_name(version));
        std::fs::copy(
            node.root.join(&file),
            copies.path().join(library.file_name(version)),
        )
        .unwrap();
    }
    let status = Command::new(ldconfig())
        .arg("-n")
        .arg(copies.path())
        .status()
        .unwrap();
    assert!(status.success());
    for library in LIBRARIES {
        let soname = library.soname(version);
        let file = library.file_name(version);
        if soname != file {
            let made = std::fs::read_link(copies.path().join(&soname))
                .unwrap_or_else(|e| panic!("ldconfig made no {soname} link: {e}"));
            assert_eq!(made, PathBuf::from(&file));
            let ours = std::fs::read_link(node.root.join(library.dir(Layout::Host)).join(&soname))
                .unwrap();
            assert_eq!(ours, PathBuf::from(&file));
        }
        let dev = std::fs::read_link(
            node.root
                .join(library.dir(Layout::Host))
                .join(library.dev_link()),
        )
        .unwrap();
        assert_eq!(dev, PathBuf::from(&soname));
    }
}

/// The loader cache lists each soname (and .so link) at its path in the root, except VDPAU's,
/// which ldconfig does not index either.
fn assert_the_loader_cache_lists_each_soname(node: &FakeNode) {
    let cache_path = node.root.join("etc/ld.so.cache");
    let cache = LdCache::parse(&std::fs::read(&cache_path).unwrap()).unwrap();
    let names: BTreeSet<&str> = cache.libraries().map(|e| e.name.as_str()).collect();
    assert!(names.contains("libcuda.so.1") && names.contains("libnvidia-ml.so.1"));
    assert!(!names.contains("libvdpau_nvidia.so.1"));
    let cuda = cache
        .libraries()
        .find(|e| e.name == "libcuda.so.1")
        .unwrap();
    assert_eq!(
        cuda.path,
        format!("/usr/lib/{}/libcuda.so.1", layout::multiarch_triplet())
    );
    let listing = Command::new(ldconfig())
        .args(["-p", "-C"])
        .arg(&cache_path)
        .output()
        .unwrap();
    assert!(
        text(&listing).contains("libnvidia-ml.so.1 (libc6,"),
        "{}",
        text(&listing)
    );
}

#[test]
fn a_host_layout_is_what_ldconfig_makes_of_a_driver_install() {
    let node = FakeNode::new("dgx-h100", Layout::Host);
    let version = &node.inventory.driver_version;
    let libs = node.library_dir();
    assert_eq!(
        libs,
        node.root.join("usr/lib").join(layout::multiarch_triplet())
    );

    assert_ldconfig_makes_the_layouts_links(&node, version);
    assert_the_loader_cache_lists_each_soname(&node);

    // One stand-in binary under every name; firmware of the driver version.
    let inodes: BTreeSet<u64> = BINARIES
        .iter()
        .map(|b| std::fs::metadata(node.binary(b)).unwrap().ino())
        .collect();
    assert_eq!(inodes.len(), 1);
    for firmware in FIRMWARE {
        assert!(
            node.root
                .join("lib/firmware/nvidia")
                .join(version)
                .join(firmware)
                .is_file()
        );
    }

    // Device nodes: the GPUs, the control nodes, and the capabilities of MIG-capable GPUs
    // (none on dgx-h100 with MIG off... dgx-h100 GPUs are MIG-capable).
    for gpu in &node.inventory.gpus {
        assert!(
            node.dev_root
                .join(format!("dev/nvidia{}", gpu.minor))
                .exists()
        );
    }
    for control in [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-caps/nvidia-cap1",
        "nvidia-caps/nvidia-cap2",
    ] {
        assert!(
            node.dev_root.join("dev").join(control).exists(),
            "{control}"
        );
    }
}

#[test]
fn a_gke_layout_has_lib64_and_no_loader_cache() {
    let node = FakeNode::new("pcie-l40s", Layout::Gke);
    assert_eq!(node.library_dir(), node.root.join("lib64"));
    assert_eq!(
        std::fs::read_link(node.root.join("lib")).unwrap(),
        PathBuf::from("lib64")
    );
    assert!(!node.root.join("etc/ld.so.cache").exists());
    assert!(node.root.join("lib64/libvdpau_nvidia.so.1").exists());
    assert!(node.binary("nvidia-smi").starts_with(node.root.join("bin")));
    let version = &node.inventory.driver_version;
    assert!(
        node.root
            .join("firmware/nvidia")
            .join(version)
            .join("gsp_ga10x.bin")
            .is_file()
    );
}

#[test]
fn nvidia_smi_reports_the_nodes_gpus_that_have_device_nodes_and_keeps_time_slices() {
    let node = FakeNode::new("dgx-h100", Layout::Host);
    let listed = node.run("nvidia-smi", &["-L"], &[], "");
    assert!(listed.status.success(), "{listed:?}");
    for gpu in &node.inventory.gpus {
        assert!(
            text(&listed).contains(&gpu.uuid),
            "{} in {}",
            gpu.uuid,
            text(&listed)
        );
    }

    // A GPU whose device node is gone is not there for the driver.
    let hidden = &node.inventory.gpus[2];
    std::fs::remove_file(node.dev_root.join(format!("dev/nvidia{}", hidden.minor))).unwrap();
    let listed = node.run(
        "nvidia-smi",
        &["--query-gpu=uuid", "--format=csv,noheader"],
        &[],
        "",
    );
    let uuids: Vec<&str> = std::str::from_utf8(&listed.stdout)
        .unwrap()
        .lines()
        .collect();
    assert_eq!(uuids.len(), node.inventory.gpus.len() - 1);
    assert!(!uuids.contains(&hidden.uuid.as_str()));

    // Time slices: what the node plugin sets, kept across processes under the device root.
    let gpu = &node.inventory.gpus[5].uuid;
    let set = node.run(
        "nvidia-smi",
        &["compute-policy", "-i", gpu, "--set-timeslice=3"],
        &[],
        "",
    );
    assert!(set.status.success(), "{set:?}");
    let set = node.run(
        "nvidia-smi",
        &["compute-policy", "-i", "0", "--set-timeslice", "1"],
        &[],
        "",
    );
    assert!(set.status.success(), "{set:?}");
    let list = node.run("nvidia-smi", &["compute-policy", "-l", "-i", gpu], &[], "");
    assert!(text(&list).ends_with(": timeslice 3\n"), "{}", text(&list));
    let bad = node.run(
        "nvidia-smi",
        &["compute-policy", "-i", gpu, "--set-timeslice=7"],
        &[],
        "",
    );
    assert!(!bad.status.success());
    let unknown = node.run(
        "nvidia-smi",
        &["compute-policy", "-i", "GPU-nope", "--set-timeslice=1"],
        &[],
        "",
    );
    assert!(!unknown.status.success());
    assert!(
        !node.run("nvidia-smi", &["-q"], &[], "").status.success(),
        "unmodelled commands fail"
    );
}

/// Stops the daemon of a pipe directory when dropped, whatever the test did.
struct DaemonGuard(PathBuf);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        if let Some(pid) = tessera_fake_driver::mps::daemon_pid(&self.0) {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}

#[test]
fn the_mps_control_daemon_serves_its_pipe_directory_until_quit() {
    let node = FakeNode::new("dgx-h100", Layout::Host);
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("pipe");
    let log = dir.path().join("log");
    let devices = format!(
        "{},{}",
        node.inventory.gpus[1].uuid, node.inventory.gpus[4].uuid
    );
    let env = |visible: &Path| {
        vec![
            ("CUDA_MPS_PIPE_DIRECTORY", pipe.clone()),
            ("CUDA_MPS_LOG_DIRECTORY", log.clone()),
            ("CUDA_VISIBLE_DEVICES", visible.to_path_buf()),
        ]
    };
    let env = env(Path::new(&devices));
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    let _guard = DaemonGuard(pipe.clone());

    // Without a daemon the client fails.
    let none = node.run("nvidia-cuda-mps-control", &[], &env, "get_server_list\n");
    assert!(!none.status.success());

    let started = node.run("nvidia-cuda-mps-control", &["-d"], &env, "");
    assert!(started.status.success(), "{started:?}");
    let pid = tessera_fake_driver::mps::daemon_pid(&pipe).expect("a pid file");
    let again = node.run("nvidia-cuda-mps-control", &["-d"], &env, "");
    assert!(
        !again.status.success(),
        "a second daemon on the same pipe directory is refused"
    );

    let answers = node.run(
        "nvidia-cuda-mps-control",
        &[],
        &env,
        "set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 1 1025M\nget_default_active_thread_percentage\nget_default_device_pinned_mem_limit 1\n",
    );
    assert!(answers.status.success(), "{answers:?}");
    assert_eq!(text(&answers), "25.0\n25.0\n1025M\n");
    let refused = node.run(
        "nvidia-cuda-mps-control",
        &[],
        &env,
        "set_default_device_pinned_mem_limit 2 1G\n",
    );
    assert!(!refused.status.success(), "the daemon serves two devices");

    let quit = node.run("nvidia-cuda-mps-control", &[], &env, "quit\n");
    assert!(quit.status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}/cmdline")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!pipe.join("control").exists());
    let control_log = std::fs::read_to_string(log.join("control.log")).unwrap();
    assert!(
        control_log.contains("Control daemon started"),
        "{control_log}"
    );
    assert!(control_log.contains(&devices), "{control_log}");
    assert!(
        control_log.ends_with("Control daemon quit\n"),
        "{control_log}"
    );
}
