//! Links the library with the fake driver libraries' placeholder soname
//! (testing/fake-driver/src/soname_placeholder.txt), which the fake driver root tool overwrites in
//! each copy with the soname of the driver library that copy stands in for.

fn main() {
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,-soname,{}",
        include_str!("../fake-driver/src/soname_placeholder.txt").trim()
    );
    println!("cargo:rerun-if-changed=../fake-driver/src/soname_placeholder.txt");
}
