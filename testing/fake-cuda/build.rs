//! Gives the cdylib the fake driver libraries' placeholder soname (the same in every one, see
//! testing/fake-driver/src/soname_placeholder.txt); the fake driver root tool writes the real one,
//! `libcuda.so.1`, into its copy. (Cargo also passes a dependency's cdylib link arguments to its
//! dependents' cdylibs, so a per-crate soname here would leak into tessera-fake-driver's
//! library; identical placeholders make that harmless.)

fn main() {
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,-soname,libtessera-fake-driver-stub.so.SONAME-PLACEHOLDER-0123456789abcdefghijklmnopqrstuvwxyz-END"
    );
}
