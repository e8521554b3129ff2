//! The ledger's arithmetic on the request path and in the statistics endpoints: pricing one
//! inference, summing a request's costs, an agent tree's totals, and percentiles/histograms
//! over 10k values. `cargo xtask bench` (or `cargo bench -p baton-ledger`); figures in
//! docs/performance.md.

use std::hint::black_box;

use baton_domain::chat::Usage;
use baton_ledger::stats::{Distribution, LATENCY_EDGES_MS, histogram, value_counts};
use baton_ledger::{Cost, Price, TreeRun, TreeTotals, price_inference};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

const VALUES: usize = 10_000;

/// Deterministic, spread-out latencies (ms): an LCG, so runs compare without a rand crate.
fn latencies() -> Vec<i64> {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    (0..VALUES)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // Skewed like real latencies: most calls fast, a long tail up to ~150 s.
            let uniform = (state >> 33) % 1_000;
            let scale = if uniform < 900 { 3_000 } else { 150_000 };
            ((state >> 11) % scale) as i64
        })
        .collect()
}

fn price(c: &mut Criterion) {
    let usage = Usage {
        tokens_in: 12_500,
        tokens_out: 1_800,
        reasoning_tokens: 600,
        cached_tokens: 4_000,
        web_search_calls: 1,
    };
    let price = Price {
        input_per_million: 2_500_000,
        output_per_million: 10_000_000,
        cached_input_per_million: Some(1_250_000),
        web_search_per_call: 10_000,
    };
    c.bench_function("price_inference", |b| {
        b.iter(|| price_inference(black_box(&usage), black_box(&price), black_box(12.5)))
    });

    // A request of ten model calls (a tool loop), each priced then summed.
    let costs: Vec<Cost> = (0..10u64)
        .map(|i| {
            let usage = Usage {
                tokens_in: 2_000 + i * 150,
                tokens_out: 120 + i * 10,
                ..usage
            };
            price_inference(&usage, &price, 12.5)
        })
        .collect();
    c.bench_function("cost_plus_10_calls", |b| {
        b.iter(|| {
            black_box(&costs)
                .iter()
                .fold(Cost::default(), |total, cost| total.plus(*cost))
        })
    });
}

fn tree(c: &mut Criterion) {
    // Root, 7 agents, 6 sub-agents under each: 50 runs, UUID-length ids.
    let ids: Vec<String> = (0..50)
        .map(|i| format!("0193b2c4-7e1a-7000-8000-{i:012}"))
        .collect();
    let runs: Vec<TreeRun<'_>> = (0..50)
        .map(|i| TreeRun {
            id: &ids[i],
            parent: match i {
                0 => None,
                1..=7 => Some(ids[0].as_str()),
                _ => Some(ids[1 + (i - 8) / 6].as_str()),
            },
            direct: 1_000 + i as i64 * 37,
        })
        .collect();
    let totals = TreeTotals::new(&runs);
    assert_eq!(
        totals.cumulative(&ids[0]),
        runs.iter().map(|r| r.direct).sum::<i64>()
    );
    c.bench_function("tree_totals_50_runs", |b| {
        b.iter(|| TreeTotals::new(black_box(&runs)))
    });
}

fn stats(c: &mut Criterion) {
    let values = latencies();
    c.bench_function("distribution_10k", |b| {
        // The clone is the input, not the work: `Distribution::of` takes and sorts its vector.
        b.iter_batched(|| values.clone(), Distribution::of, BatchSize::SmallInput)
    });
    c.bench_function("histogram_10k", |b| {
        b.iter(|| histogram(black_box(&values), &LATENCY_EDGES_MS))
    });
    let depths: Vec<i64> = values.iter().map(|v| v % 6).collect();
    c.bench_function("value_counts_10k", |b| {
        b.iter(|| value_counts(black_box(&depths)))
    });
}

criterion_group!(benches, price, tree, stats);
criterion_main!(benches);
