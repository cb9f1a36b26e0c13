//! Build, validate and serialize the rank table of 4,096 servers x 8 devices (32,768 ranks).

use std::hint::black_box;

use atlasboost_benches::cluster;
use atlasboost_core::Chip;
use atlasboost_core::ranktable::{
    BuildOptions, RankTable, build_table, validate_table, validate_value,
};
use criterion::{Criterion, criterion_group, criterion_main};

fn ranktable(c: &mut Criterion) {
    let devices = cluster(4096, 8);
    let opts = BuildOptions::default();
    let Ok(table) = build_table(&devices, &opts) else {
        panic!("the benchmark cluster must build");
    };
    let json = table.to_json_pretty();
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&json) else {
        panic!("the table must parse");
    };

    let mut g = c.benchmark_group("ranktable_4096x8");
    g.sample_size(20);
    // What `atlasboost run` does: build (which validates) and serialize.
    g.bench_function("build_validate_serialize", |b| {
        b.iter(|| {
            let t = build_table(black_box(&devices), &opts).map(|t| t.to_json_pretty());
            black_box(t.map(|s| s.len()).unwrap_or_default())
        })
    });
    g.bench_function("validate_table", |b| {
        b.iter(|| black_box(validate_table(black_box(&table), Chip::Ascend910).len()))
    });
    g.bench_function("validate_value", |b| {
        b.iter(|| black_box(validate_value(black_box(&value), Chip::Ascend910).len()))
    });
    g.bench_function("serialize", |b| {
        b.iter(|| black_box(table.to_json_pretty().len()))
    });
    g.bench_function("parse_and_validate", |b| {
        b.iter(|| {
            let t = RankTable::parse(
                black_box(&json),
                std::path::Path::new("t.json"),
                Chip::Ascend910,
            );
            black_box(t.map(|t| t.rank_count()).unwrap_or_default())
        })
    });
    g.finish();
}

criterion_group!(benches, ranktable);
criterion_main!(benches);
