//! `tessera-cdi-hook update-ldcache` run as the runtime runs it: container state on stdin, the
//! bundle's config.json naming the root filesystem.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use tessera_driver_root::hook::CONF_FILE;
use tessera_driver_root::ldcache::{Entry, LdCache};

const HOOK: &str = env!("CARGO_BIN_EXE_tessera-cdi-hook");

struct Bundle {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    rootfs: PathBuf,
}

impl Bundle {
    /// A bundle whose config names `rootfs` relative to it, as containerd writes it.
    fn new() -> Bundle {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            br#"{"ociVersion":"1.2.0","root":{"path":"rootfs"},"process":{"args":["sh"]}}"#,
        )
        .unwrap();
        Bundle {
            dir: dir.path().to_path_buf(),
            _dir: dir,
            rootfs,
        }
    }

    fn run_hook(&self, args: &[&str]) -> Output {
        let state = format!(
            r#"{{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":4242,"bundle":"{}"}}"#,
            self.rootfs.parent().unwrap().display()
        );
        let mut child = Command::new(HOOK)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A hook that refuses its arguments exits before it reads the state: a broken pipe then
        // is expected, and its exit status and message are what the tests look at.
        match child.stdin.take().unwrap().write_all(state.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            written => written.unwrap(),
        }
        child.wait_with_output().unwrap()
    }

    fn cache(&self) -> LdCache {
        LdCache::parse(&std::fs::read(self.rootfs.join("etc/ld.so.cache")).unwrap()).unwrap()
    }
}

const ARGS: [&str; 6] = [
    "update-ldcache",
    "--library",
    "libcuda.so.1=/usr/local/nvidia/lib64/libcuda.so.1",
    "--library",
    "libnvidia-ml.so.1=/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "--library=libc.so.6=/usr/local/nvidia/lib64/libc-is-not-ours.so.6",
];

#[test]
fn the_driver_goes_in_front_of_the_images_own_cache() {
    let bundle = Bundle::new();
    std::fs::create_dir_all(bundle.rootfs.join("etc/ld.so.conf.d")).unwrap();
    let image_cache = LdCache {
        entries: vec![
            Entry::native("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            Entry::native("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
        ],
        generator: Some("ldconfig (GNU libc) 2.36".into()),
        ..LdCache::default()
    };
    std::fs::write(
        bundle.rootfs.join("etc/ld.so.cache"),
        image_cache.to_bytes(),
    )
    .unwrap();

    let output = bundle.run_hook(&ARGS);
    assert!(output.status.success(), "{output:?}");
    let cache = bundle.cache();
    let cuda: Vec<&str> = cache
        .entries
        .iter()
        .filter(|e| e.name == "libcuda.so.1")
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(
        cuda,
        vec![
            "/usr/local/nvidia/lib64/libcuda.so.1",
            "/usr/local/cuda/compat/libcuda.so.1"
        ],
        "the driver's libcuda first; the image's entries stay"
    );
    assert_eq!(cache.generator.as_deref(), Some("ldconfig (GNU libc) 2.36"));
    let conf =
        std::fs::read_to_string(bundle.rootfs.join("etc/ld.so.conf.d").join(CONF_FILE)).unwrap();
    assert!(conf.ends_with("\n/usr/local/nvidia/lib64\n"), "{conf}");
    // Running again (a second claim's spec in one container) changes nothing more.
    assert!(bundle.run_hook(&ARGS).status.success());
    assert_eq!(bundle.cache(), cache);
}

#[test]
fn an_image_without_a_cache_or_an_etc_gets_one() {
    let bundle = Bundle::new();
    let output = bundle.run_hook(&ARGS);
    assert!(output.status.success(), "{output:?}");
    let cache = bundle.cache();
    assert_eq!(cache.entries.len(), 3);
    assert!(
        !bundle.rootfs.join("etc/ld.so.conf.d").exists(),
        "no conf.d is made"
    );
}

#[test]
fn links_in_the_image_cannot_send_the_write_outside_its_root() {
    let bundle = Bundle::new();
    let victim = bundle.dir.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("ld.so.cache"), b"the host's").unwrap();

    // /etc/ld.so.cache -> the victim file: read as missing, and replaced, not written through.
    std::fs::create_dir_all(bundle.rootfs.join("etc")).unwrap();
    std::os::unix::fs::symlink(
        victim.join("ld.so.cache"),
        bundle.rootfs.join("etc/ld.so.cache"),
    )
    .unwrap();
    let output = bundle.run_hook(&ARGS);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        std::fs::read(victim.join("ld.so.cache")).unwrap(),
        b"the host's"
    );
    assert!(
        !std::fs::symlink_metadata(bundle.rootfs.join("etc/ld.so.cache"))
            .unwrap()
            .is_symlink()
    );

    // /etc -> the victim directory (absolute and relative): refused, the victim untouched.
    for target in [victim.clone(), PathBuf::from("../../victim")] {
        let bundle = Bundle::new();
        let victim = bundle.dir.join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        let target = if target.is_absolute() {
            victim.clone()
        } else {
            target
        };
        std::os::unix::fs::symlink(&target, bundle.rootfs.join("etc")).unwrap();
        let output = bundle.run_hook(&ARGS);
        assert!(!output.status.success(), "{target:?}: {output:?}");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0, "{target:?}");
    }
}

#[test]
fn bad_input_is_an_error_naming_it() {
    let bundle = Bundle::new();
    let version = bundle.run_hook(&["--version"]);
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        concat!("tessera-cdi-hook ", env!("CARGO_PKG_VERSION"))
    );
    let no_args = bundle.run_hook(&["update-ldcache"]);
    assert!(String::from_utf8_lossy(&no_args.stderr).contains("no --library"));
    let unknown = bundle.run_hook(&["create-symlinks"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown command"));
    std::fs::create_dir_all(bundle.rootfs.join("etc")).unwrap();
    std::fs::write(bundle.rootfs.join("etc/ld.so.cache"), b"not a cache").unwrap();
    let corrupt = bundle.run_hook(&ARGS);
    assert!(!corrupt.status.success());
    assert!(
        String::from_utf8_lossy(&corrupt.stderr).contains("not a cache"),
        "{corrupt:?}"
    );
    assert_eq!(
        std::fs::read(bundle.rootfs.join("etc/ld.so.cache")).unwrap(),
        b"not a cache"
    );

    let mut child = Command::new(HOOK)
        .args(ARGS)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{}").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("container state"),
        "{output:?}"
    );
}
