/*
 * metrics_internal.h - what the files of the metrics module share: the
 * writing of the autoscaling signals (autoscale.c) into the page that
 * metrics.c renders, and the release of a model's series and statistics
 * when its last weight set is gone (model_holds.c).  Nothing outside
 * server/metrics/ includes it.
 */
#ifndef ATTN_METRICS_INTERNAL_H
#define ATTN_METRICS_INTERNAL_H

#include "json/jsonw.h"

/* Appends the attention_* histograms and gauges, HELP and TYPE included. */
void autoscale_render(jw_buf *w);

/* Drop the series (autoscale.c) and the statistics (model_stats.c) of the
 * model name, whose last weight set is gone (model_holds.c). */
void autoscale_forget(const char *name);
void model_stats_forget(const char *name);

#endif
