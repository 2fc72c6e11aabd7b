/* report — see report.h. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* Enough for dlbench's full run, the larger of the two programs. */
#define REPORT_FIGS_MAX 160

static struct fig figs[REPORT_FIGS_MAX];
static int nfigs;
static const char *cur_section = "";

void report_section(const char *name)
{
	cur_section = name;
}

struct fig *report_find(const char *key)
{
	for (int i = 0; i < nfigs; i++)
		if (strcmp(figs[i].key, key) == 0)
			return &figs[i];
	return NULL;
}

struct fig *report_decl(const char *key, const char *unit, const char *fmt,
			...)
{
	struct fig *f = report_find(key);
	va_list ap;

	if (f)
		return f;
	/* A truncated key would never be found again: a programming error,
	 * said at once rather than as a figure declared twice. */
	if (strlen(key) >= sizeof(f->key)) {
		fprintf(stderr, "%s: figure key too long: %s\n",
			program_invocation_short_name, key);
		exit(1);
	}
	if (nfigs == REPORT_FIGS_MAX) {
		fprintf(stderr, "%s: too many figures\n",
			program_invocation_short_name);
		exit(1);
	}
	f = &figs[nfigs++];
	memset(f, 0, sizeof(*f));
	snprintf(f->key, sizeof(f->key), "%s", key);
	f->unit = unit;
	f->section = cur_section;
	va_start(ap, fmt);
	vsnprintf(f->label, sizeof(f->label), fmt, ap);
	va_end(ap);
	return f;
}

void report_add(struct fig *f, double v)
{
	samples_add(&f->reps, v);
}

void report_goal(struct fig *f, enum report_goal g, double v)
{
	f->goal = g;
	f->goal_v = v;
}

void report_note(struct fig *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(f->note, sizeof(f->note), fmt, ap);
	va_end(ap);
}

int report_has(const struct fig *f)
{
	return f && !f->is_null && f->reps.n > 0;
}

void report_summary(const struct fig *f, double *med, double *lo,
		    double *hi)
{
	struct samples s = { 0 };

	/* A copy is sorted, not the repeats: the JSON has them in order. */
	for (size_t i = 0; i < f->reps.n; i++)
		samples_add(&s, f->reps.v[i]);
	samples_quantile(&s, 0.5); /* sorts */
	if (s.n == 0)
		*med = NAN;
	else if (s.n % 2)
		*med = s.v[s.n / 2];
	else
		*med = (s.v[s.n / 2 - 1] + s.v[s.n / 2]) / 2;
	*lo = s.n ? samples_min(&s) : NAN;
	*hi = s.n ? samples_max(&s) : NAN;
	samples_free(&s);
}

int report_met(const struct fig *f)
{
	double med, lo, hi;

	if (f->goal == REPORT_GOAL_NONE || !report_has(f))
		return -1;
	report_summary(f, &med, &lo, &hi);
	switch (f->goal) {
	case REPORT_GOAL_LE:
		return med <= f->goal_v;
	case REPORT_GOAL_GE:
		return med >= f->goal_v;
	case REPORT_GOAL_LT:
		return med < f->goal_v;
	default:
		return -1;
	}
}

static const char *goal_op(enum report_goal g)
{
	return g == REPORT_GOAL_LE ? "<=" : g == REPORT_GOAL_GE ? ">=" : "<";
}

void report_print_table(FILE *o, const struct report_style *st)
{
	const char *section = NULL;

	fprintf(o, "\n%-*s %*s %-*s %s\n", st->label_w, "figure",
		st->median_w, "median", st->spread_w, "spread (min..max)",
		st->unit_head);
	for (int i = 0; i < nfigs; i++) {
		const struct fig *f = &figs[i];
		char med[32], lo[32], hi[32], spread[96], goal[48] = "";
		double m, l, h;

		if (!section || strcmp(section, f->section) != 0) {
			section = f->section;
			fprintf(o, "-- %s\n", section);
		}
		if (!report_has(f)) {
			fprintf(o, "%-*s %*s %-*s %-*s %s\n", st->label_w,
				f->label, st->median_w, "-", st->spread_w, "",
				st->unit_w, f->unit,
				f->note[0] ? f->note : "not measured");
			continue;
		}
		report_summary(f, &m, &l, &h);
		st->fmt(med, sizeof(med), m, f->unit);
		st->fmt(lo, sizeof(lo), l, f->unit);
		st->fmt(hi, sizeof(hi), h, f->unit);
		if (f->reps.n > 1)
			snprintf(spread, sizeof(spread), "%s..%s (n=%zu)", lo, hi,
				 f->reps.n);
		else
			snprintf(spread, sizeof(spread), "(n=1)");
		if (f->goal != REPORT_GOAL_NONE)
			snprintf(goal, sizeof(goal), "%s %g %s",
				 goal_op(f->goal), f->goal_v,
				 report_met(f) ? "MET" : "MISSED");
		fprintf(o, "%-*s %*s %-*s %-*s %s%s%s\n", st->label_w, f->label,
			st->median_w, med, st->spread_w, spread, st->unit_w,
			f->unit, goal, f->note[0] && goal[0] ? "; " : "",
			f->note);
	}
}

void report_json_figures(FILE *o)
{
	fprintf(o, "  \"figures\": {\n");
	for (int i = 0; i < nfigs; i++) {
		const struct fig *f = &figs[i];
		double med = NAN, lo = NAN, hi = NAN;
		int met = report_met(f);

		if (report_has(f))
			report_summary(f, &med, &lo, &hi);
		fprintf(o, "    ");
		report_json_str(o, f->key);
		fprintf(o, ": {\"section\": ");
		report_json_str(o, f->section);
		fprintf(o, ", \"label\": ");
		report_json_str(o, f->label);
		fprintf(o, ", \"unit\": ");
		report_json_str(o, f->unit);
		fprintf(o, ", \"median\": ");
		report_json_num(o, med);
		fprintf(o, ", \"min\": ");
		report_json_num(o, lo);
		fprintf(o, ", \"max\": ");
		report_json_num(o, hi);
		fprintf(o, ", \"repeats\": [");
		for (size_t r = 0; report_has(f) && r < f->reps.n; r++) {
			fprintf(o, r ? ", " : "");
			report_json_num(o, f->reps.v[r]);
		}
		fprintf(o, "]");
		if (f->goal != REPORT_GOAL_NONE)
			fprintf(o, ", \"goal\": \"%s %g\", \"met\": %s",
				goal_op(f->goal), f->goal_v,
				met < 0 ? "null" : met ? "true" : "false");
		if (f->note[0]) {
			fprintf(o, ", \"note\": ");
			report_json_str(o, f->note);
		}
		fprintf(o, "}%s\n", i + 1 < nfigs ? "," : "");
	}
	fprintf(o, "  }\n");
}

void report_json_str(FILE *o, const char *s)
{
	fputc('"', o);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(o, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(o, "\\u%04x", *s);
		else
			fputc(*s, o);
	}
	fputc('"', o);
}

void report_json_num(FILE *o, double v)
{
	if (isnan(v) || isinf(v))
		fprintf(o, "null");
	else
		fprintf(o, "%.6g", v);
}
