//! The device context: a clear error where there is no GPU (CI), and on a GPU
//! (FOXHUNT_GPU_TESTS=1) buffers that round-trip and a compile error that carries NVRTC's log.
#![cfg(feature = "cuda")]

use foxhunt_gpu::{GpuContext, GpuError, Module};

fn gpu_tests() -> bool {
    std::env::var("FOXHUNT_GPU_TESTS").as_deref() == Ok("1")
}

/// Without a usable GPU (no driver, as on CI), asking for one is a clear error, never a panic.
#[test]
fn without_a_gpu_asking_for_one_says_no_cuda_device_found() {
    if gpu_tests() {
        return;
    }
    let err = GpuContext::new(0).err().expect("no usable CUDA here");
    assert!(matches!(err, GpuError::NoCuda(_)), "{err:?}");
    assert!(
        err.to_string().starts_with("no CUDA device found: "),
        "{err}"
    );
}

#[test]
fn buffers_round_trip_and_every_module_compiles() {
    if !gpu_tests() {
        eprintln!("skipped: set FOXHUNT_GPU_TESTS=1 to run on a CUDA device");
        return;
    }
    let ctx = GpuContext::new(0).expect("a GPU");
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
        ctx.kernel(
            m,
            match m {
                Module::Env => "env_step",
                Module::Dqn => "adam_step",
            },
        )
        .unwrap_or_else(|e| panic!("module {}: {e}", m.name()));
    }
    let err = ctx
        .kernel(Module::Env, "no_such_kernel")
        .expect_err("unknown");
    assert!(err.to_string().contains("no_such_kernel"), "{err}");
}
