/*
 * metrics_internal.h - what the files of the metrics module share: the
 * writing of the autoscaling signals (autoscale.c) into the page that
 * metrics.c renders.  Nothing outside server/metrics/ includes it.
 */
#ifndef ATTN_METRICS_INTERNAL_H
#define ATTN_METRICS_INTERNAL_H

#include "json/jsonw.h"

/* Appends the attention_* histograms and gauges, HELP and TYPE included. */
void autoscale_render(jw_buf *w);

#endif
