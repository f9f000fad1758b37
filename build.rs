//! Link-time footprint tuning for the release `agentd` binary (see `footprint/README.md`).
//!
//! Two linker options, both about how much of the binary a running daemon has resident:
//!
//! - `--symbol-ordering-file=footprint/startup.order`: the functions a daemon runs from start
//!   to its first answers are placed side by side at the front of `.text`. Scattered, they
//!   pull in most of the binary's code at start (the kernel maps file pages 64 KiB around
//!   each fault); packed, they fit in under a megabyte.
//! - `-z pack-relative-relocs` (DT_RELR): the position-independent binary's relative
//!   relocations in a few KiB instead of ~330 KiB of `.rela.dyn` that the loader reads once.
//!
//! Both change layout only, never behaviour, and are applied only where they are known to
//! work: release builds for x86_64-unknown-linux-gnu linked by the toolchain's own lld (the
//! default since Rust 1.90), and DT_RELR only against a glibc that supports it (2.36+).
//! `AGENTD_LINK_TUNING=0` turns both off.

use std::env;
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=footprint/startup.order");
    println!("cargo:rerun-if-env-changed=AGENTD_LINK_TUNING");
    println!("cargo:rerun-if-env-changed=AGENTD_KEEP_SYMBOLS");

    let var = |k: &str| env::var(k).unwrap_or_default();
    let release = var("PROFILE") == "release";
    let target = var("TARGET") == "x86_64-unknown-linux-gnu";
    // A linker chosen by the user (config `linker`, `-C linker=`, `-C linker-features`) may
    // not be lld and may not know these options.
    let default_linker = env::var_os("RUSTC_LINKER").is_none()
        && !["linker", "link-self-contained"]
            .iter()
            .any(|f| var("CARGO_ENCODED_RUSTFLAGS").contains(f));
    let wanted = var("AGENTD_LINK_TUNING") != "0";

    // The symbol table is never loaded at run time; it only makes the file bigger. It is
    // kept for footprint/make-order.sh, which needs the names (AGENTD_KEEP_SYMBOLS=1).
    if release && var("CARGO_CFG_TARGET_OS") == "linux" && var("AGENTD_KEEP_SYMBOLS") != "1" {
        println!("cargo:rustc-link-arg-bin=agentd=-Wl,--strip-all");
    }
    if !(release && target && default_linker && wanted) {
        return;
    }

    let order = Path::new(&var("CARGO_MANIFEST_DIR")).join("footprint/startup.order");
    if order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=agentd=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        // Symbols the code no longer has are skipped; regenerating the file picks up new ones.
        println!("cargo:rustc-link-arg-bin=agentd=-Wl,--no-warn-symbol-ordering");
    }
    if glibc_has_dt_relr() {
        println!("cargo:rustc-link-arg-bin=agentd=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the glibc being linked against loads DT_RELR: it names the symbol version
/// `GLIBC_ABI_DT_RELR` that such binaries require, which older loaders would refuse.
fn glibc_has_dt_relr() -> bool {
    const NEEDLE: &[u8] = b"GLIBC_ABI_DT_RELR";
    [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
        "/usr/lib64/libc.so.6",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok())
    .is_some_and(|lib| lib.windows(NEEDLE.len()).any(|w| w == NEEDLE))
}
