//! The cache format against glibc itself: this machine's `/etc/ld.so.cache` (written by its
//! `ldconfig`) reads, and what this crate writes from it lists the same libraries through
//! `ldconfig -p -C <file>` as the original does.

use std::path::Path;
use std::process::Command;

use tessera_driver_root::ldcache::{Entry, LdCache};

const SYSTEM_CACHE: &str = "/etc/ld.so.cache";

fn ldconfig() -> &'static str {
    ["/usr/sbin/ldconfig", "/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("ldconfig (glibc) is needed to check the ld.so.cache format; install libc-bin")
}

fn listing(cache: &Path) -> Vec<String> {
    let output = Command::new(ldconfig())
        .args(["-p", "-C"])
        .arg(cache)
        .output()
        .expect("run ldconfig -p");
    assert!(
        output.status.success(),
        "ldconfig -p -C {}: {output:?}",
        cache.display()
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .skip(1) // "N libs found in cache ..."
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[test]
fn the_system_cache_round_trips_through_glibc() {
    let bytes = std::fs::read(SYSTEM_CACHE).expect("this test needs the system's /etc/ld.so.cache");
    let cache = LdCache::parse(&bytes).expect("parse the system cache");
    assert!(
        cache.libraries().any(|e| e.name == "libc.so.6"),
        "libc.so.6 is listed"
    );
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("ld.so.cache");
    std::fs::write(&written, cache.to_bytes()).unwrap();
    assert_eq!(listing(&written), listing(Path::new(SYSTEM_CACHE)));
    assert_eq!(
        LdCache::parse(&std::fs::read(&written).unwrap()).unwrap(),
        cache
    );
}

#[test]
fn added_entries_are_listed_first() {
    let bytes = std::fs::read(SYSTEM_CACHE).expect("this test needs the system's /etc/ld.so.cache");
    let mut cache = LdCache::parse(&bytes).unwrap();
    cache.prefer(vec![
        Entry::native("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        Entry::native("libc.so.6", "/opt/elsewhere/libc.so.6"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("ld.so.cache");
    std::fs::write(&written, cache.to_bytes()).unwrap();
    let output = Command::new(ldconfig())
        .args(["-p", "-C"])
        .arg(&written)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("libcuda.so.1 (libc6,"), "{text}");
    let libc: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("libc.so.6 "))
        .collect();
    assert!(libc[0].ends_with("/opt/elsewhere/libc.so.6"), "{libc:?}");
}
