//! With the `spdk` feature: compile weir's C glue against SPDK's headers and link
//! SPDK (or, with `spdk-mock`, against the test stand-in in csrc/mock). Without
//! it: nothing; the crate builds with no C at all.
//!
//! SPDK missing (pkg-config finds no `spdk_nvme`) is not a build failure, so that
//! `cargo check --features spdk` works anywhere: the crate then builds without the
//! FFI and `SpdkDevice::open` fails naming what pkg-config said. A warning says so
//! at build time.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(weir_spdk_linked)");
    println!("cargo::rerun-if-changed=csrc");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    #[cfg(feature = "spdk")]
    spdk::build();
}

#[cfg(feature = "spdk")]
mod spdk {
    pub(super) fn build() {
        let mut glue = cc::Build::new();
        glue.file("csrc/weir_spdk_glue.c")
            .warnings(true)
            .extra_warnings(true);
        if cfg!(feature = "spdk-mock") {
            glue.include("csrc/mock/include")
                .file("csrc/mock/spdk_mock.c")
                .file("csrc/mock/spdk_mock_nvme.c");
            glue.compile("weir_spdk_glue");
            println!("cargo::rustc-link-lib=pthread");
            println!("cargo::rustc-cfg=weir_spdk_linked");
            return;
        }
        let found = pkg_config::Config::new()
            .cargo_metadata(true)
            .probe("spdk_nvme")
            .and_then(|nvme| {
                let env = pkg_config::Config::new()
                    .cargo_metadata(true)
                    .probe("spdk_env_dpdk")?;
                Ok((nvme, env))
            });
        match found {
            Ok((nvme, env)) => {
                for dir in nvme.include_paths.iter().chain(&env.include_paths) {
                    glue.include(dir);
                }
                glue.compile("weir_spdk_glue");
                println!("cargo::rustc-cfg=weir_spdk_linked");
            }
            Err(e) => {
                let text = e.to_string();
                let why = text
                    .lines()
                    .map(str::trim)
                    .find(|l| l.contains("was not found"))
                    .unwrap_or("pkg-config failed")
                    .to_owned();
                println!(
                    "cargo::warning=--features spdk, but pkg-config found no SPDK ({why}); \
                     this build cannot open SPDK devices"
                );
                println!("cargo::rustc-env=WEIR_SPDK_MISSING={why}");
            }
        }
    }
}
