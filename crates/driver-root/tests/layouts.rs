//! Discovery against the driver root layouts Tessera meets: the one surveyed on a real H100 node
//! (GKE style, no loader cache), a host install at `/` (Debian/Ubuntu, merged /usr, an old
//! driver's leftovers), the GPU operator's driver container (with the daemons' sockets), RHEL's
//! `/usr/lib64` and an arm64 host.

use std::path::{Path, PathBuf};

use pretty_assertions::assert_eq;
use tessera_driver_root::discover::{DiscoveryError, DriverFiles, discover};
use tessera_driver_root::ldcache::{Entry, FLAG_AARCH64_LIB64, FLAG_ELF_LIBC6, LdCache};
use tessera_driver_root::tree::{FileKind, MemoryTree};

/// The libraries of the surveyed 580 driver: stem and soname suffix (`None`: the versioned name).
const DRIVER_580: &[(&str, Option<&str>)] = &[
    ("libcuda", Some("1")),
    ("libnvidia-ml", Some("1")),
    ("libcudadebugger", Some("1")),
    ("libnvidia-ptxjitcompiler", Some("1")),
    ("libnvidia-nvvm", Some("4")),
    ("libnvidia-cfg", Some("1")),
    ("libnvidia-opencl", Some("1")),
    ("libnvidia-gpucomp", None),
    ("libnvidia-allocator", Some("1")),
    ("libnvidia-pkcs11-openssl3", None),
    ("libnvidia-tls", None),
    ("libnvidia-glcore", None),
    ("libnvidia-glsi", None),
    ("libnvidia-glvkspirv", None),
    ("libnvidia-eglcore", None),
    ("libnvidia-rtcore", None),
    ("libnvidia-encode", Some("1")),
    ("libnvidia-fbc", Some("1")),
    ("libnvidia-opticalflow", Some("1")),
    ("libnvcuvid", Some("1")),
    ("libnvoptix", Some("1")),
    ("libGLX_nvidia", Some("0")),
    ("libEGL_nvidia", Some("0")),
    ("libGLESv2_nvidia", Some("2")),
    ("libGLESv1_CM_nvidia", Some("1")),
    ("libvdpau_nvidia", Some("1")),
];

const V580: &str = "580.159.04";

/// Installs `libs` of `version` in `dir` with soname and `.so` links; returns the cache entries
/// ldconfig would make for them.
fn install(
    tree: &mut MemoryTree,
    dir: &str,
    version: &str,
    libs: &[(&str, Option<&str>)],
    dev_links: bool,
) -> Vec<Entry> {
    let mut entries = Vec::new();
    for (stem, major) in libs {
        let file = format!("{stem}.so.{version}");
        tree.file(&format!("{dir}/{file}"), b"\x7fELF");
        let soname = major.map_or(file.clone(), |m| format!("{stem}.so.{m}"));
        if soname != file {
            tree.symlink(&format!("{dir}/{soname}"), &file);
        }
        entries.push(Entry::native(&soname, format!("{dir}/{soname}")));
        if dev_links {
            tree.symlink(&format!("{dir}/{stem}.so"), &soname);
            entries.push(Entry::native(
                format!("{stem}.so"),
                format!("{dir}/{stem}.so"),
            ));
        }
    }
    entries
}

fn binaries(tree: &mut MemoryTree, dir: &str) {
    for name in [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ] {
        tree.executable(&format!("{dir}/{name}"));
    }
}

fn library_files(files: &DriverFiles) -> Vec<String> {
    files
        .libraries
        .iter()
        .map(|l| l.path.display().to_string())
        .collect()
}

fn aliases_of(files: &DriverFiles, file: &str) -> Vec<String> {
    let library = files
        .libraries
        .iter()
        .find(|l| l.path == Path::new(file))
        .unwrap_or_else(|| panic!("{file} not discovered"));
    let mut aliases = library.aliases.clone();
    aliases.sort();
    aliases
}

fn targets(placed: &[tessera_driver_root::discover::Placed]) -> Vec<String> {
    placed
        .iter()
        .map(|p| p.target.display().to_string())
        .collect()
}

/// `/usr/local/nvidia` of the surveyed H100 node (a GKE-style root): `lib64/` with every library
/// and link, `lib -> lib64`, `bin/`, `firmware/nvidia/<version>/`, its own glibc, no loader cache.
fn surveyed_gke_root() -> MemoryTree {
    let mut tree = MemoryTree::new();
    install(&mut tree, "/lib64", V580, DRIVER_580, true);
    tree.symlink("/lib", "lib64");
    binaries(&mut tree, "/bin");
    tree.file(&format!("/firmware/nvidia/{V580}/gsp_ga10x.bin"), b"")
        .file(&format!("/firmware/nvidia/{V580}/gsp_tu10x.bin"), b"")
        .file("/etc/nsswitch.conf", b"")
        .file("/etc/passwd", b"")
        .file("/glibc/libc.so.6", b"")
        .file("/glibc/ld-linux-x86-64.so.2", b"")
        .file("/kernel.release", b"6.18.44")
        .add("/dev", FileKind::Dir, b"")
        .add("/proc", FileKind::Dir, b"");
    tree
}

#[test]
fn the_surveyed_h100_root() {
    let files = discover(&surveyed_gke_root(), "/usr/local/nvidia").unwrap();
    assert_eq!(files.version, V580);
    assert!(
        !files.from_loader_cache,
        "found through the search directories"
    );
    assert_eq!(files.libraries.len(), DRIVER_580.len());
    assert!(
        library_files(&files)
            .iter()
            .all(|p| p.starts_with("/lib64/lib"))
    );
    assert_eq!(
        aliases_of(&files, &format!("/lib64/libcuda.so.{V580}")),
        vec!["libcuda.so", "libcuda.so.1"]
    );
    assert_eq!(
        aliases_of(&files, &format!("/lib64/libnvidia-tls.so.{V580}")),
        vec!["libnvidia-tls.so"],
        "a library whose soname is its versioned name has only the .so link"
    );
    assert_eq!(
        targets(&files.binaries),
        vec![
            "/bin/nvidia-smi",
            "/bin/nvidia-debugdump",
            "/bin/nvidia-persistenced",
            "/bin/nvidia-cuda-mps-control",
            "/bin/nvidia-cuda-mps-server"
        ]
    );
    assert_eq!(
        targets(&files.firmware),
        vec![
            format!("/lib/firmware/nvidia/{V580}/gsp_ga10x.bin"),
            format!("/lib/firmware/nvidia/{V580}/gsp_tu10x.bin")
        ]
    );
    assert_eq!(
        files.firmware[0].source,
        PathBuf::from(format!("/firmware/nvidia/{V580}/gsp_ga10x.bin"))
    );
    assert!(files.ipc_sockets.is_empty());
    assert_eq!(files.library_dirs(), vec![PathBuf::from("/lib64")]);
}

/// The tree of a Debian/Ubuntu host with the driver from packages in the multiarch directory
/// `dir` (see [`a_host_install_at_the_root`]).
fn debian_host_install(dir: &str) -> MemoryTree {
    let mut tree = MemoryTree::new();
    let (vdpau, others): (Vec<_>, Vec<_>) = DRIVER_580
        .iter()
        .partition(|(stem, _)| *stem == "libvdpau_nvidia");
    let mut entries = install(&mut tree, dir, V580, &others, false);
    install(&mut tree, &format!("{dir}/vdpau"), V580, &vdpau, false);
    tree.symlink(&format!("{dir}/libcuda.so"), "libcuda.so.1");
    entries.push(Entry::native("libcuda.so", format!("{dir}/libcuda.so")));
    tree.file(&format!("{dir}/libcuda.so.535.104.05"), b"")
        .file(&format!("{dir}/libc.so.6"), b"")
        .symlink(&format!("{dir}/libz.so.1"), "libz.so.1.2.13")
        .file(&format!("{dir}/libz.so.1.2.13"), b"")
        .symlink("/lib", "usr/lib")
        .symlink("/lib64", "usr/lib64")
        .file("/usr/lib64/ld-linux-x86-64.so.2", b"");
    entries.push(Entry::native("libc.so.6", format!("{dir}/libc.so.6")));
    entries.push(Entry::native("libz.so.1", format!("{dir}/libz.so.1")));
    // ldconfig writes the cache with paths under /lib too on merged-/usr systems.
    entries.push(Entry::native(
        "libnvidia-ml.so.1",
        "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    ));
    let cache = LdCache {
        entries,
        ..LdCache::default()
    };
    tree.file("/etc/ld.so.cache", &cache.to_bytes());
    binaries(&mut tree, "/usr/bin");
    tree.file(
        &format!("/usr/lib/firmware/nvidia/{V580}/gsp_ga10x.bin"),
        b"",
    )
    .file(
        &format!("/usr/lib/firmware/nvidia/{V580}/gsp_tu10x.bin"),
        b"",
    )
    .file("/usr/lib/firmware/nvidia/535.104.05/gsp_ga10x.bin", b"");
    tree
}

/// A Debian/Ubuntu host with the driver from packages: merged /usr (`/lib -> usr/lib`), the
/// driver in the multiarch directory among the system's own libraries, VDPAU in `vdpau/`
/// (not in the cache), development links only for some libraries, and an older driver's
/// libcuda left behind.
#[test]
fn a_host_install_at_the_root() {
    let dir = "/usr/lib/x86_64-linux-gnu";
    let tree = debian_host_install(dir);

    let files = discover(&tree, "/").unwrap();
    assert_eq!(files.version, V580);
    assert!(files.from_loader_cache);
    assert_eq!(
        files.version_from,
        PathBuf::from(format!("{dir}/libcuda.so.{V580}"))
    );
    let found = library_files(&files);
    assert_eq!(found.len(), DRIVER_580.len(), "{found:#?}");
    assert!(found.contains(&format!("{dir}/vdpau/libvdpau_nvidia.so.{V580}")));
    assert!(
        !found
            .iter()
            .any(|p| p.contains("535") || p.contains("libc.so") || p.contains("libz"))
    );
    assert_eq!(
        aliases_of(&files, &format!("{dir}/libcuda.so.{V580}")),
        vec!["libcuda.so", "libcuda.so.1"]
    );
    assert_eq!(
        aliases_of(&files, &format!("{dir}/libnvidia-ml.so.{V580}")),
        vec!["libnvidia-ml.so.1"]
    );
    assert_eq!(
        files.library_dirs(),
        vec![PathBuf::from(dir), PathBuf::from(format!("{dir}/vdpau"))]
    );
    assert_eq!(
        files.binary("nvidia-smi").unwrap().target,
        PathBuf::from("/usr/bin/nvidia-smi")
    );
    assert_eq!(
        targets(&files.firmware),
        vec![
            format!("/lib/firmware/nvidia/{V580}/gsp_ga10x.bin"),
            format!("/lib/firmware/nvidia/{V580}/gsp_tu10x.bin")
        ],
        "found through /lib -> usr/lib, the current version's only"
    );
    assert_eq!(
        files.firmware[0].source,
        PathBuf::from(format!("/usr/lib/firmware/nvidia/{V580}/gsp_ga10x.bin"))
    );
}

/// The GPU operator's driver container root (`/run/nvidia/driver`): a full Ubuntu root with the
/// driver, its cache, and the persistence and fabric manager daemons' sockets.
#[test]
fn the_gpu_operator_driver_root() {
    let mut tree = MemoryTree::new();
    let dir = "/usr/lib/x86_64-linux-gnu";
    let entries = install(&mut tree, dir, "570.124.06", &DRIVER_580[..6], true);
    tree.file(
        "/etc/ld.so.cache",
        &LdCache {
            entries,
            ..LdCache::default()
        }
        .to_bytes(),
    );
    binaries(&mut tree, "/usr/bin");
    tree.add("/run/nvidia-persistenced/socket", FileKind::Socket, b"")
        .add("/run/nvidia-fabricmanager/socket", FileKind::Socket, b"")
        .symlink("/var/run", "../run")
        .file("/run/nvidia-persistenced/nvidia-persistenced.pid", b"");
    let files = discover(&tree, "/run/nvidia/driver").unwrap();
    assert_eq!(files.version, "570.124.06");
    assert_eq!(files.libraries.len(), 6);
    assert_eq!(
        files.ipc_sockets,
        vec![
            PathBuf::from("/run/nvidia-persistenced/socket"),
            PathBuf::from("/run/nvidia-fabricmanager/socket")
        ],
        "each once, though /var/run leads to the same sockets"
    );
}

#[test]
fn rhel_and_arm64_library_directories() {
    let mut rhel = MemoryTree::new();
    let entries = install(&mut rhel, "/usr/lib64", V580, DRIVER_580, false);
    rhel.file(
        "/etc/ld.so.cache",
        &LdCache {
            entries,
            ..LdCache::default()
        }
        .to_bytes(),
    );
    let files = discover(&rhel, "/").unwrap();
    assert_eq!(files.library_dirs(), vec![PathBuf::from("/usr/lib64")]);
    assert!(
        files.binaries.is_empty(),
        "a driver without its tools still has libraries"
    );

    let mut arm = MemoryTree::new();
    let dir = "/usr/lib/aarch64-linux-gnu";
    let entries: Vec<Entry> = install(&mut arm, dir, V580, DRIVER_580, false)
        .into_iter()
        .map(|e| Entry {
            flags: FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64,
            ..e
        })
        .collect();
    arm.file(
        "/etc/ld.so.cache",
        &LdCache {
            entries,
            ..LdCache::default()
        }
        .to_bytes(),
    );
    binaries(&mut arm, "/usr/bin");
    let files = discover(&arm, "/").unwrap();
    assert!(files.from_loader_cache);
    assert_eq!(files.library_dirs(), vec![PathBuf::from(dir)]);
    assert_eq!(files.libraries.len(), DRIVER_580.len());
    // The NVML backend's default library on arm64 (GH200/GB200 nodes).
    assert_eq!(
        files.library_named("libnvidia-ml.so.1"),
        Some(PathBuf::from(dir).join("libnvidia-ml.so.1"))
    );
    assert_eq!(files.library_named("libnotthere.so.1"), None);
}

#[test]
fn without_a_cache_the_version_libcuda_so_1_leads_to_wins() {
    let mut tree = MemoryTree::new();
    install(&mut tree, "/lib64", "535.104.05", &DRIVER_580[..2], false);
    install(&mut tree, "/lib64", V580, &DRIVER_580[..2], false);
    // The last install moved the soname links to 580.
    let files = discover(&tree, "/home/kubernetes/bin/nvidia").unwrap();
    assert_eq!(files.version, V580);
    assert_eq!(files.libraries.len(), 2);
}

#[test]
fn a_root_without_a_driver_is_an_error_that_says_where_to_point() {
    let mut tree = MemoryTree::new();
    tree.file("/usr/lib/x86_64-linux-gnu/libc.so.6", b"")
        .file("/etc/ld.so.cache", b"garbage");
    let err = discover(&tree, "/run/nvidia/driver").unwrap_err();
    assert!(matches!(err, DiscoveryError::NoDriver { .. }));
    let text = err.to_string();
    assert!(
        text.contains("/run/nvidia/driver") && text.contains("--driver-root"),
        "{text}"
    );
}

#[test]
fn a_fake_driver_root_on_disk_is_discovered_like_a_real_one() {
    // The layout tessera-fake-driver writes (host layout), built by hand here so this crate's
    // tests need no other crate: the same rules find it through a HostTree.
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libcuda.so.550.54.15"), b"").unwrap();
    std::os::unix::fs::symlink("libcuda.so.550.54.15", lib.join("libcuda.so.1")).unwrap();
    std::os::unix::fs::symlink(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        lib.join("libcuda.so"),
    )
    .unwrap();
    let files = discover(
        &tessera_driver_root::tree::HostTree::new(dir.path()),
        "fake",
    )
    .unwrap();
    assert_eq!(files.version, "550.54.15");
    assert_eq!(
        aliases_of(&files, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        vec!["libcuda.so", "libcuda.so.1"],
        "an absolute link counts, resolved inside the root"
    );
}
