//! `nvidia-smi`, `nvidia-cuda-mps-control`, `nvidia-cuda-mps-server`, `nvidia-imex`,
//! `nvidia-imex-ctl`, `nvidia-debugdump` and `nvidia-persistenced` of a fake driver root, by the name it runs under (see
//! `tessera_fake_driver::tool`).

fn main() -> std::process::ExitCode {
    tessera_fake_driver::tool::main(std::env::args().collect())
}
