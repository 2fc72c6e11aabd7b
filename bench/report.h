/* report — the figures a benchmark program reports: a registry of figures
 * (key, unit, label, section), each with its repeats in order, a goal and a
 * note; their median and min..max spread; the table and the "figures"
 * member of the --json file. dlbench and dlshare-gpubench both use it, each
 * with its own column widths and number format (struct report_style).
 *
 * The registry is this module's, one per process; the figures it hands out
 * live until exit. Single-threaded callers only.
 */
#ifndef DLSHARE_BENCH_REPORT_H
#define DLSHARE_BENCH_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "util.h"

/* A goal on a figure's median. */
enum report_goal {
	REPORT_GOAL_NONE,
	REPORT_GOAL_LE,
	REPORT_GOAL_GE,
	REPORT_GOAL_LT,
};

struct fig {
	char key[64];
	char label[96];
	const char *unit;        /* how the values are shown */
	const char *section;
	struct samples reps;     /* in repeat order */
	enum report_goal goal;
	double goal_v;
	char note[160];
	int is_null;             /* not measured (quick mode, limits) */
};

/* The section the figures declared from now on belong to (a static
 * string). */
void report_section(const char *name);

/* Declares a figure (once; later calls with the same key return it). The
 * key is copied; a key that does not fit, or one figure too many, ends the
 * program (status 1, said on stderr). */
__attribute__((format(printf, 3, 4)))
struct fig *report_decl(const char *key, const char *unit, const char *fmt,
			...);
/* The figure of key, or NULL. */
struct fig *report_find(const char *key);

/* Appends one repeat's value (dropped when out of memory). */
void report_add(struct fig *f, double v);
void report_goal(struct fig *f, enum report_goal g, double v);
__attribute__((format(printf, 2, 3)))
void report_note(struct fig *f, const char *fmt, ...);

/* 1 when f (may be NULL) has a value: measured, at least one repeat. */
int report_has(const struct fig *f);
/* The median (the mean of the middle two for an even count), min and max
 * over the repeats; NaN for each when there are none. The repeats
 * themselves stay in order. */
void report_summary(const struct fig *f, double *med, double *lo,
		    double *hi);
/* 1 met, 0 missed, -1 no goal or no value. */
int report_met(const struct fig *f);

/* How a program lays out its table: column widths, the heading of the last
 * column, and how a value of a unit is written. */
struct report_style {
	int label_w, median_w, spread_w, unit_w;
	const char *unit_head;
	void (*fmt)(char *buf, size_t cap, double v, const char *unit);
};

/* The table of every figure, by section, to o. */
void report_print_table(FILE *o, const struct report_style *st);

/* The "figures" member of a JSON object (its last: no comma after it),
 * every figure with its repeats, goal and note, indented by two. */
void report_json_figures(FILE *o);

/* A JSON string of s (quoted, escaped). */
void report_json_str(FILE *o, const char *s);
/* A JSON number of v (%.6g), null for NaN and infinities. */
void report_json_num(FILE *o, double v);

#endif
