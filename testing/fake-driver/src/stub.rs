//! Sonames of the fake driver libraries. The stand-in for libraries that only need to exist
//! (OpenCL, video, graphics, ...: the tessera-fake-driver-stub cdylib), fake-nvml and fake-cuda
//! are all linked with one placeholder soname; the layout tool writes each copy's real soname
//! over it (`libnvidia-ml.so.1`, `libcuda.so.1`, `libnvidia-opencl.so.1`, ...). A soname is a NUL-terminated string in `.dynstr` that
//! `DT_SONAME` points at; a shorter name and NUL padding in its place keep the file valid, and
//! `ldconfig` and the dynamic loader read the new name.

/// The placeholder soname the cdylib is linked with (build.rs).
pub const SONAME_PLACEHOLDER: &str = include_str!("soname_placeholder.txt");

/// Why a soname cannot be set.
#[derive(Debug, thiserror::Error)]
pub enum SonameError {
    #[error(
        "the library holds {0} copies of the placeholder soname instead of one; is it a build of \
         tessera-fake-nvml, tessera-fake-cuda or tessera-fake-driver?"
    )]
    Placeholder(usize),
    #[error("soname `{0}` is longer than the placeholder it replaces")]
    TooLong(String),
}

/// Replaces the placeholder soname in `library` (the bytes of a built fake driver library) by
/// `soname`.
pub fn patch_soname(library: &mut [u8], soname: &str) -> Result<(), SonameError> {
    let placeholder = SONAME_PLACEHOLDER.trim().as_bytes();
    let mut needle = placeholder.to_vec();
    needle.push(0);
    let found: Vec<usize> = memchr::memmem::find_iter(library, &needle).collect();
    let [at] = found[..] else {
        return Err(SonameError::Placeholder(found.len()));
    };
    if soname.len() >= placeholder.len() || soname.contains('\0') {
        return Err(SonameError::TooLong(soname.to_owned()));
    }
    let region = &mut library[at..at + placeholder.len()];
    region.fill(0);
    region[..soname.len()].copy_from_slice(soname.as_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_is_replaced_in_place() {
        let placeholder = SONAME_PLACEHOLDER.trim();
        let mut bytes = b"\0libc.so.6\0".to_vec();
        bytes.extend_from_slice(placeholder.as_bytes());
        bytes.extend_from_slice(b"\0tail");
        let len = bytes.len();
        patch_soname(&mut bytes, "libnvidia-tls.so.550.54.15").unwrap();
        assert_eq!(bytes.len(), len);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("\0libnvidia-tls.so.550.54.15\0"), "{text:?}");
        assert!(text.ends_with("\0tail"));
        assert!(matches!(
            patch_soname(&mut bytes, "x"),
            Err(SonameError::Placeholder(0))
        ));
        let mut again = placeholder.as_bytes().to_vec();
        again.push(0);
        assert!(matches!(
            patch_soname(&mut again, &"x".repeat(200)),
            Err(SonameError::TooLong(_))
        ));
    }
}
