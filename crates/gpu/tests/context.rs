//! The device context: a clear error where there is no GPU (CI), and on a GPU
//! (FOXHUNT_GPU_TESTS=1) buffers that round-trip, a compile error that carries NVRTC's log, and
//! occupancy answers kept per shape and per function (shared by its handles).
#![cfg(feature = "cuda")]

use foxhunt_gpu::{GpuContext, GpuError, Grid, KernelCache, Module};
use foxhunt_testkit::{gpu_machine, gpu_tests};

/// Without a usable GPU (no driver, as on CI), asking for one is a clear error, never a panic.
#[test]
fn without_a_gpu_asking_for_one_says_no_cuda_device_found() {
    if gpu_machine() {
        return;
    }
    let err = GpuContext::new(0).err().expect("no usable CUDA here");
    assert!(matches!(err, GpuError::NoCuda(_)), "{err:?}");
    assert!(
        err.to_string().starts_with("no CUDA device found: "),
        "{err}"
    );
}

/// Every kernel module compiles for Hopper (sm_90) with the options a context uses, where NVRTC
/// can be loaded; no GPU is needed, so CI compiles the kernels too (it installs NVRTC and sets
/// FOXHUNT_NVRTC_TESTS=1, which makes a missing NVRTC a failure instead of a skip).
#[test]
fn every_module_compiles_for_hopper_without_a_gpu() {
    let required = std::env::var("FOXHUNT_NVRTC_TESTS").as_deref() == Ok("1");
    for m in Module::ALL {
        match foxhunt_gpu::compile_check(m, "sm_90") {
            Ok(c) => {
                assert!(c.cubin_bytes > 0, "module {}: an empty CUBIN", m.name());
                // ptxas accounts for the module's kernels.
                let kernel = a_kernel(m);
                assert!(
                    c.resources
                        .iter()
                        .any(|l| l.starts_with(&format!("{kernel}: ")) && l.contains(" registers")),
                    "module {}: no resource lines for {kernel}: {:?}",
                    m.name(),
                    c.resources
                );
            }
            Err(GpuError::NoCuda(why)) if !required => {
                eprintln!("skipped: {why} (FOXHUNT_NVRTC_TESTS=1 requires it)");
                return;
            }
            Err(e) => panic!("module {}: {e}", m.name()),
        }
    }
}

#[test]
fn buffers_round_trip_and_every_module_compiles() {
    if !gpu_tests() {
        return;
    }
    let ctx = GpuContext::with_cache(0, KernelCache::off()).expect("a GPU");
    let v: Vec<f64> = (0..1000).map(|i| f64::from(i) * 0.5).collect();
    let mut b = ctx.upload(&v).expect("upload");
    assert_eq!(ctx.download(&b).expect("download"), v);
    ctx.write(&mut b, &v[..10]).expect("prefix");
    assert_eq!(b.len(), 10);
    assert_eq!(ctx.download(&b).expect("download"), &v[..10]);
    let err = ctx.write(&mut b, &vec![0.0; 1001]).expect_err("too long");
    assert!(matches!(err, GpuError::Shape(_)), "{err}");
    let mut c = ctx.alloc::<f64>(10).expect("alloc");
    ctx.copy(&b, &mut c).expect("copy");
    assert_eq!(ctx.download(&c).expect("download"), &v[..10]);
    for m in Module::ALL {
        ctx.kernel(m, a_kernel(m))
            .unwrap_or_else(|e| panic!("module {}: {e}", m.name()));
    }
    assert_eq!(ctx.compile_stats().compiled, Module::ALL.len());
    let err = ctx
        .kernel(Module::Env, "no_such_kernel")
        .expect_err("unknown");
    assert!(err.to_string().contains("no_such_kernel"), "{err}");
}

fn a_kernel(m: Module) -> &'static str {
    match m {
        Module::Env => "env_step",
        Module::Dqn => "adam_step",
        Module::Eval => "eval_stitch",
        Module::Epoch => "epoch_steps",
    }
}

/// The kernel cache: a second context compiles nothing; a damaged entry is found, rebuilt and
/// rewritten, never loaded.
#[test]
fn a_warm_kernel_cache_compiles_nothing_and_a_damaged_entry_is_rebuilt() {
    if !gpu_tests() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("foxhunt-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let load_all = || {
        let ctx = GpuContext::with_cache(0, KernelCache::at(&dir)).expect("a GPU");
        let t0 = std::time::Instant::now();
        for m in Module::ALL {
            ctx.kernel(m, a_kernel(m)).expect("kernel");
        }
        (ctx.compile_stats(), t0.elapsed())
    };
    let (cold, cold_time) = load_all();
    assert_eq!(
        (cold.compiled, cold.cached),
        (Module::ALL.len(), 0),
        "{cold:?}"
    );
    assert!(cold.cache_errors.is_empty(), "{cold:?}");
    let (warm, warm_time) = load_all();
    assert_eq!(
        (warm.compiled, warm.cached, warm.rebuilt),
        (0, Module::ALL.len(), 0),
        "{warm:?}"
    );
    // Damage one entry: it is rebuilt and rewritten; the next context finds it whole again.
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    assert_eq!(entries.len(), Module::ALL.len());
    let mut bytes = std::fs::read(&entries[0]).expect("entry");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&entries[0], &bytes).expect("damage");
    let (fixed, _) = load_all();
    assert_eq!(
        (fixed.compiled, fixed.cached, fixed.rebuilt),
        (1, Module::ALL.len() - 1, 1),
        "{fixed:?}"
    );
    let (again, _) = load_all();
    assert_eq!(
        (again.compiled, again.cached),
        (0, Module::ALL.len()),
        "{again:?}"
    );
    eprintln!(
        "kernel modules: cold (NVRTC) {:.1} ms, warm (cache) {:.1} ms",
        cold_time.as_secs_f64() * 1e3,
        warm_time.as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kernel keeps the driver's occupancy answers: asked again, in another order, each shape's
/// answer is the one a fresh handle of the same function gets from the driver for that shape.
#[test]
fn occupancy_answers_are_kept_per_shape() {
    if !gpu_tests() {
        return;
    }
    let ctx = GpuContext::with_cache(0, KernelCache::off()).expect("a GPU");
    let shared = 96 * 1024;
    let fresh = || {
        let k = ctx.kernel(Module::Eval, "eval_chunks").expect("kernel");
        k.allow_shared(shared).expect("shared memory");
        k
    };
    let grid = |blocks, threads, shared_bytes| Grid {
        blocks,
        threads,
        shared_bytes,
    };
    // Shapes that differ in one field at a time: blocks a multiprocessor by threads and by
    // shared memory, clusters by size and by threads.
    let blocks = [(128, 0), (1024, 0), (128, shared), (512, 0)];
    let clusters = [
        grid(2, 1024, 0),
        grid(4, 1024, 0),
        grid(2, 128, 0),
        grid(2, 128, shared),
    ];
    let want_blocks: Vec<u32> = blocks
        .iter()
        .map(|&(t, s)| fresh().blocks_per_sm(t, s).expect("occupancy"))
        .collect();
    let want_clusters: Vec<u32> = clusters
        .iter()
        .map(|&g| fresh().max_clusters(&ctx, g).expect("clusters"))
        .collect();
    let mut distinct = want_blocks.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() >= 3,
        "shapes chosen to differ give {want_blocks:?}: the test would not see a key's missing field"
    );
    let k = fresh();
    for round in 0..3 {
        for (i, &(t, s)) in blocks.iter().enumerate().rev() {
            assert_eq!(
                k.blocks_per_sm(t, s).expect("occupancy"),
                want_blocks[i],
                "round {round}, {t} threads, {s} bytes"
            );
        }
        for (i, &g) in clusters.iter().enumerate().rev() {
            assert_eq!(
                k.max_clusters(&ctx, g).expect("clusters"),
                want_clusters[i],
                "round {round}, {g:?}"
            );
        }
    }
}

/// The occupancy answers belong to the function, not to a handle: shared memory allowed or
/// taken back through one handle changes what every other handle of the function answers.
#[test]
fn occupancy_answers_follow_shared_memory_allowed_through_another_handle() {
    if !gpu_tests() {
        return;
    }
    let ctx = GpuContext::with_cache(0, KernelCache::off()).expect("a GPU");
    let asker = ctx.kernel(Module::Eval, "eval_chunks").expect("kernel");
    let setter = ctx.kernel(Module::Eval, "eval_chunks").expect("kernel");
    let (threads, shared) = (128, 96 * 1024);
    // Before any opt-in the block does not fit (an answer of 0 or a refusal; 0 is kept).
    let before = asker.blocks_per_sm(threads, shared);
    assert!(matches!(before, Ok(0) | Err(_)), "{before:?}");
    setter.allow_shared(shared).expect("shared memory");
    let allowed = asker.blocks_per_sm(threads, shared).expect("occupancy");
    assert!(allowed >= 1, "{shared} bytes allowed, yet {allowed} blocks");
    // Taken back below the shape's need, the kept answer must go too.
    setter.allow_shared(0).expect("shared memory");
    let taken_back = asker.blocks_per_sm(threads, shared);
    assert!(
        matches!(taken_back, Ok(0) | Err(_)),
        "shared memory taken back through another handle, yet {taken_back:?} (before: {before:?})"
    );
    // A worker's handle is a handle of the same function.
    let worker = ctx
        .worker()
        .expect("worker")
        .kernel(Module::Eval, "eval_chunks");
    worker
        .expect("kernel")
        .allow_shared(shared)
        .expect("shared memory");
    assert_eq!(
        asker.blocks_per_sm(threads, shared).expect("occupancy"),
        allowed
    );
}
