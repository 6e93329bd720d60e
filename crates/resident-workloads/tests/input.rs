//! Input parsing against hostile files: every bad line is a typed error with its line number.

use std::path::Path;

use resident_workloads::input::*;
use resident_workloads::{InputError, LineError};

fn edges(text: &[u8]) -> Result<EdgeList, InputError> {
    parse_edge_list(Path::new("g.txt"), text)
}

fn readings(text: &[u8]) -> Result<Vec<SensorReading>, InputError> {
    parse_readings(Path::new("r.csv"), text)
}

fn bad_line(r: Result<impl std::fmt::Debug, InputError>) -> (usize, LineError) {
    match r {
        Err(InputError::BadLine { line, reason, .. }) => (line, reason),
        other => panic!("expected BadLine, got {other:?}"),
    }
}

#[test]
fn edge_lists_remap_sparse_ids_dedup_and_keep_self_loops() {
    let g = edges(
        b"# header\n\n1000000000000 7\r\n7\t7\n7 1000000000000 # back\n1000000000000 7\n   \n",
    )
    .unwrap();
    assert_eq!(g.ids, vec![7, 1_000_000_000_000]);
    assert_eq!(g.edges, vec![(0, 0), (0, 1), (1, 0)]);
    assert_eq!(edges(b"").unwrap().nodes(), 0);
    assert_eq!(edges(b"# only comments\n#\n").unwrap().nodes(), 0);
}

#[test]
fn edge_list_bad_lines_name_their_number() {
    assert_eq!(bad_line(edges(b"1 2\n3\n")).0, 2);
    assert_eq!(bad_line(edges(b"1 2\n\n1 2 3\n")).0, 3);
    assert_eq!(bad_line(edges(b"-1 2\n")).0, 1);
    assert_eq!(bad_line(edges(b"1 2\na b\n")).0, 2);
    assert_eq!(bad_line(edges(b"1.5 2\n")).0, 1);
    assert_eq!(bad_line(edges(b"1 99999999999999999999999\n")).0, 1);
    assert_eq!(bad_line(edges(b"1 2\n\xff\xfe 3\n")).0, 2);
    assert_eq!(bad_line(edges(b"1,2\n")).0, 1);
    let (line, reason) = bad_line(edges(b"1 2\n2 x\n"));
    assert_eq!(line, 2);
    assert_eq!(
        reason,
        LineError::BadId {
            what: "dst",
            field: "x".into()
        }
    );
    assert!(reason.to_string().contains("'x'"), "{reason}");
    assert!(matches!(
        bad_line(edges(b"1 2\n\xff\xfe 3\n")).1,
        LineError::NotUtf8
    ));
    assert!(matches!(
        bad_line(edges(b"1 2\n\n1 2 3\n")).1,
        LineError::ExtraField { .. }
    ));
    let e = edges(b"0 1\n\x00\n").unwrap_err().to_string();
    assert!(e.starts_with("g.txt:2:"), "{e}");
}

#[test]
fn readings_parse_with_optional_header_and_name_bad_lines() {
    let r = readings(b"sensor,value\n3,1.5\n\n# c\n 4 , -2e3 \n3,0\n").unwrap();
    assert_eq!(
        r,
        vec![
            SensorReading {
                sensor: 3,
                value: 1.5
            },
            SensorReading {
                sensor: 4,
                value: -2000.0
            },
            SensorReading {
                sensor: 3,
                value: 0.0
            },
        ]
    );
    assert_eq!(
        bad_line(readings(b"1,2\nsensor,value\n")).0,
        2,
        "a header only on line 1"
    );
    assert_eq!(bad_line(readings(b"1,2\n-1,2\n")).0, 2);
    assert_eq!(bad_line(readings(b"1,NaN\n")).0, 1);
    assert!(matches!(
        bad_line(readings(b"1,NaN\n")).1,
        LineError::NotFinite { .. }
    ));
    assert!(matches!(
        bad_line(readings(b"1;2\n")).1,
        LineError::Fields {
            expected: "sensor,value",
            ..
        }
    ));
    assert_eq!(bad_line(readings(b"1,inf\n")).0, 1);
    assert_eq!(bad_line(readings(b"1,2,3\n")).0, 1);
    assert_eq!(bad_line(readings(b"1\n")).0, 1);
    assert_eq!(bad_line(readings(b"1;2\n")).0, 1);
    assert_eq!(bad_line(readings(b"1,\n")).0, 1);
    assert_eq!(bad_line(readings(b"0,1\n1,2\nx,3\n")).0, 3);
    assert_eq!(bad_line(readings(b"1,\xff\n")).0, 1);
}

#[test]
fn missing_files_are_io_errors_and_generators_are_deterministic() {
    assert!(matches!(
        read_edge_list(Path::new("/nonexistent/g.txt")),
        Err(InputError::Io { .. })
    ));
    assert!(matches!(
        read_readings(Path::new("/nonexistent/r.csv")),
        Err(InputError::Io { .. })
    ));
    let a = generate_graph(1000, 5, 7).unwrap();
    assert_eq!(a, generate_graph(1000, 5, 7).unwrap());
    assert_ne!(a, generate_graph(1000, 5, 8).unwrap());
    assert!(a.edges.len() > 4900 && a.edges.len() <= 5000);
    assert!(matches!(
        generate_graph(0, 5, 1),
        Err(InputError::BadParameter { .. })
    ));
    let (r1, s1) = generate_readings(10_000, 20, 500, 3).unwrap();
    let (r2, s2) = generate_readings(10_000, 20, 500, 3).unwrap();
    assert_eq!((r1, s1), (r2, s2));
    assert!(matches!(
        generate_readings(10, 0, 5, 1),
        Err(InputError::BadParameter { .. })
    ));
}

/// Issue 31: `resident demo pagerank --graph` on a file of one 50 MB line printed all of it in
/// its error. Every field or line an error quotes is now an excerpt.
#[test]
fn a_long_line_is_quoted_as_a_short_excerpt() {
    let long = "7".repeat(5_000_000);
    let cases: Vec<Vec<u8>> = vec![
        format!("{long}x 1\n").into_bytes(),    // BadId
        format!("1 2 {long}\n").into_bytes(),   // ExtraField
        format!("{long}é\n").into_bytes(),      // Fields (one field), cut mid-character
        format!("1 {long}9999\n").into_bytes(), // BadId: above 2^64
    ];
    for text in &cases {
        let e = edges(text).unwrap_err().to_string();
        assert!(e.len() < 200, "{} bytes: {}", e.len(), &e[..200]);
        assert!(e.contains("bytes)"), "{e}");
    }
    for text in [
        format!("{long},1\n"),
        format!("1,{long}x\n"),
        format!("1,{long}\n").replace("1,7", "1,1e999"),
        format!("{long}\n"),
    ] {
        let e = readings(text.as_bytes()).unwrap_err().to_string();
        assert!(e.len() < 200, "{} bytes: {}", e.len(), &e[..200]);
    }
}
