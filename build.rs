//! Compiles the gRPC contract with protox (pure Rust; no protoc on a fresh machine) and saves the
//! encoded descriptor set for server reflection.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = ["corral/v1/corral.proto", "corral/v1/worker.proto"];
    let fds = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("corral_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
