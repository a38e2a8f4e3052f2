//! Shards of a walk-forward run: which windows a process trains when a scheduler (a Slurm job
//! array, a Kubernetes Indexed Job) runs the same command several times over one run directory.
//!
//! Assignment: window `w` belongs to shard `w mod N`. It covers every window exactly once for
//! any N, needs nothing but the window's index (so every shard agrees without talking), and
//! deals consecutive windows, which are of similar size, to different shards.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// Shard `index` of `count` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This shard, `0..count`.
    pub index: usize,
    /// How many shards the run has.
    pub count: usize,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

fn bad(m: String) -> TrainError {
    TrainError::Options(m)
}

impl Shard {
    /// A shard, checked: `count >= 1` and `index < count`.
    pub fn new(index: usize, count: usize) -> Result<Self, TrainError> {
        if count == 0 || index >= count {
            return Err(bad(format!(
                "shard {index}/{count}: the shard index must be in 0..{count} and the count at least 1"
            )));
        }
        Ok(Self { index, count })
    }

    /// `K/N` as `--shard` takes it.
    pub fn parse(text: &str) -> Result<Self, TrainError> {
        let (k, n) = text.split_once('/').ok_or_else(|| {
            bad(format!(
                "--shard {text}: expected K/N, e.g. 0/4 (shard K of N, from 0)"
            ))
        })?;
        let num = |s: &str, what: &str| {
            s.trim().parse::<usize>().map_err(|_| {
                bad(format!(
                    "--shard {text}: the {what} {s:?} is not a whole number"
                ))
            })
        };
        Self::new(num(k, "index")?, num(n, "count")?)
    }

    /// The shard the scheduler's environment names, if any: a Slurm job array
    /// (`SLURM_ARRAY_TASK_ID` with `SLURM_ARRAY_TASK_COUNT`, or with `SLURM_ARRAY_TASK_MIN` and
    /// `SLURM_ARRAY_TASK_MAX` for arrays that do not start at 0), or a Kubernetes Indexed Job
    /// (`JOB_COMPLETION_INDEX`, with the count from `count` (`--shard-count`) or
    /// `JOB_COMPLETIONS`, which the shipped manifest sets to the Job's completions). `var`
    /// reads a variable (`std::env::var` in the binary).
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
        count: Option<usize>,
    ) -> Result<Option<Self>, TrainError> {
        let num = |name: &str| -> Result<Option<usize>, TrainError> {
            match var(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| bad(format!("{name}={v:?} is not a whole number"))),
            }
        };
        if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            if let Some(step) = num("SLURM_ARRAY_TASK_STEP")?
                && step != 1
            {
                return Err(bad(format!(
                    "SLURM_ARRAY_TASK_STEP={step}: foxhunt's shards are a job array of \
                     consecutive indices (e.g. --array=0-3); give --shard K/N instead"
                )));
            }
            let min = num("SLURM_ARRAY_TASK_MIN")?;
            let max = num("SLURM_ARRAY_TASK_MAX")?;
            let (index, n) = match (min, max, num("SLURM_ARRAY_TASK_COUNT")?) {
                (Some(min), Some(max), count) if min <= id && id <= max => {
                    let n = max - min + 1;
                    if let Some(c) = count.filter(|&c| c != n) {
                        return Err(bad(format!(
                            "SLURM_ARRAY_TASK_COUNT={c} disagrees with \
                             SLURM_ARRAY_TASK_MIN..MAX={min}..{max} ({n} tasks): an array with \
                             gaps cannot be a set of shards; give --shard K/N instead"
                        )));
                    }
                    (id - min, n)
                }
                (Some(min), Some(max), _) => {
                    return Err(bad(format!(
                        "SLURM_ARRAY_TASK_ID={id} lies outside SLURM_ARRAY_TASK_MIN..MAX={min}..{max}"
                    )));
                }
                (None, None, Some(c)) => (id, c),
                _ => {
                    return Err(bad(format!(
                        "SLURM_ARRAY_TASK_ID={id} is set but neither SLURM_ARRAY_TASK_COUNT nor \
                         SLURM_ARRAY_TASK_MIN and _MAX: cannot tell how many shards there are"
                    )));
                }
            };
            return Self::new(index, n)
                .map(Some)
                .map_err(|e| bad(format!("from the Slurm job-array environment: {e}")));
        }
        if let Some(index) = num("JOB_COMPLETION_INDEX")? {
            let n = match (count, num("JOB_COMPLETIONS")?) {
                (Some(c), _) | (None, Some(c)) => c,
                (None, None) => {
                    return Err(bad(format!(
                        "JOB_COMPLETION_INDEX={index} is set but the number of shards is not: \
                         pass --shard-count N (the Job's completions) or set JOB_COMPLETIONS"
                    )));
                }
            };
            return Self::new(index, n)
                .map(Some)
                .map_err(|e| bad(format!("from the Kubernetes Indexed Job environment: {e}")));
        }
        Ok(None)
    }

    /// Whether window `index` is this shard's.
    pub fn owns(&self, window: usize) -> bool {
        window % self.count == self.index
    }

    /// The shard that owns window `window` in a run of `count` shards.
    pub fn owner(window: usize, count: usize) -> Self {
        Self {
            index: window % count,
            count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_window_belongs_to_exactly_one_shard() {
        for windows in 1..=200 {
            for n in 1..=20 {
                let mut seen = vec![0u32; windows];
                for k in 0..n {
                    let s = Shard::new(k, n).expect("valid");
                    for (w, count) in seen.iter_mut().enumerate() {
                        if s.owns(w) {
                            *count += 1;
                            assert_eq!(Shard::owner(w, n), s);
                        }
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "{windows} windows, {n} shards"
                );
            }
        }
    }

    #[test]
    fn the_flag_parses_and_refuses_with_the_reason() {
        assert_eq!(
            Shard::parse("2/5").expect("ok"),
            Shard { index: 2, count: 5 }
        );
        for (text, says) in [
            ("5/5", "must be in 0..5"),
            ("0/0", "at least 1"),
            ("3", "expected K/N"),
            ("a/4", "index \"a\""),
            ("1/-4", "count \"-4\""),
        ] {
            let e = Shard::parse(text).expect_err(text).to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        move |name| v.iter().find(|(k, _)| k == name).map(|(_, x)| x.clone())
    }

    #[test]
    fn schedulers_environments_name_the_shard() {
        let s = |pairs: &[(&str, &str)], count| Shard::from_env(env(pairs), count);
        assert_eq!(s(&[], None).expect("none"), None);
        let slurm = [
            ("SLURM_ARRAY_TASK_ID", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
        ];
        assert_eq!(
            s(&slurm, None).expect("ok"),
            Some(Shard { index: 2, count: 3 })
        );
        // An array that starts at 1 (--array=1-4): task 3 is shard 2 of 4.
        let from_one = [
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "4"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert_eq!(
            s(&from_one, None).expect("ok"),
            Some(Shard { index: 2, count: 4 })
        );
        let k8s = [("JOB_COMPLETION_INDEX", "1")];
        assert_eq!(
            s(&k8s, Some(4)).expect("ok"),
            Some(Shard { index: 1, count: 4 })
        );
        let k8s_env = [("JOB_COMPLETION_INDEX", "1"), ("JOB_COMPLETIONS", "2")];
        assert_eq!(
            s(&k8s_env, None).expect("ok"),
            Some(Shard { index: 1, count: 2 })
        );
        for (pairs, count, says) in [
            (
                &[("SLURM_ARRAY_TASK_ID", "2")][..],
                None,
                "cannot tell how many",
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "x"),
                    ("SLURM_ARRAY_TASK_COUNT", "3"),
                ],
                None,
                "SLURM_ARRAY_TASK_ID=\"x\" is not a whole number",
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_COUNT", "3"),
                ],
                None,
                "must be in 0..3",
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "5"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_MAX", "4"),
                ],
                None,
                "outside",
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "2"),
                    ("SLURM_ARRAY_TASK_MIN", "0"),
                    ("SLURM_ARRAY_TASK_MAX", "6"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ],
                None,
                "disagrees",
            ),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "2"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                    ("SLURM_ARRAY_TASK_STEP", "2"),
                ],
                None,
                "consecutive",
            ),
            (&[("JOB_COMPLETION_INDEX", "0")], None, "--shard-count"),
            (&[("JOB_COMPLETION_INDEX", "4")], Some(4), "must be in 0..4"),
        ] {
            let e = s(pairs, count).expect_err(says).to_string();
            assert!(e.contains(says), "{pairs:?}: {e}");
        }
    }
}
