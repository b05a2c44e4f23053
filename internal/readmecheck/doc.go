// Package readmecheck holds the test that compiles every Go snippet of the
// repository's README.md against this module (see readme_test.go for the
// marker each snippet carries). It has no code of its own.
package readmecheck
