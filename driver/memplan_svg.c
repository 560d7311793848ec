/* memplan_svg.c - the memory plan as a picture: one rectangle per arena
 * buffer, x the schedule steps it is alive in, y its bytes in the arena
 * (offset 0 at the bottom); a line for the bytes alive at each step, whose
 * highest point is the lower bound.  Hovering a rectangle names it. */
#include <stdio.h>
#include <stdlib.h>

#include "driver.h"

enum { LEFT = 90, RIGHT = 20, TOP = 56, BOTTOM = 50, PLOT_W = 960, PLOT_H = 520 };

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    default:
      if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
  }
}

static size_t aligned(size_t n) { return (n + KL_MEM_ALIGN - 1) / KL_MEM_ALIGN * KL_MEM_ALIGN; }

/* A colour per buffer that neighbours tell apart; scratch is orange. */
static void colour(FILE *f, int b, bool scratch) {
  if (scratch) {
    fputs("#f0a030", f);
    return;
  }
  unsigned h = (unsigned)b * 2654435761u;
  fprintf(f, "hsl(%u,55%%,%u%%)", 180 + (h >> 8) % 90, 55 + (h >> 20) % 20);
}

int kiln_write_memplan_svg(const kl_codegen_result *cg, const char *model, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return -1;
  }
  int nsteps = cg->nsteps > 0 ? cg->nsteps : 1;
  double top = (double)(cg->arena_bytes ? cg->arena_bytes : 1);
  double sx = (double)PLOT_W / nsteps, sy = PLOT_H / top;
  int w = LEFT + PLOT_W + RIGHT, h = TOP + PLOT_H + BOTTOM, y0 = TOP + PLOT_H;
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", w, h, w, h);
  fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", w, h);
  fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"15\">memory plan of ", LEFT);
  xml_text(f, model);
  fprintf(f, ": arena %zu bytes, lower bound %zu, naive sum %zu</text>\n", cg->arena_bytes,
          cg->arena_lower_bound, cg->naive_bytes);
  fprintf(f, "<text x=\"%d\" y=\"38\" fill=\"#555\">%d buffers over %d steps; planned / lower "
             "bound = %.3f; the line is the bytes alive at each step</text>\n", LEFT, cg->nmembufs,
          cg->nsteps, cg->arena_lower_bound ? (double)cg->arena_bytes / (double)cg->arena_lower_bound : 1.0);
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f6f6f6\" stroke=\"#999\"/>\n",
          LEFT, TOP, PLOT_W, PLOT_H);
  int nvalues = cg->nvalue_membufs;
  for (int b = 0; b < cg->nmembufs; b++) {
    const kl_membuf *m = &cg->membufs[b];
    if (!m->bytes || m->last < m->first) continue;
    double hh = (double)m->bytes * sy;
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"",
            LEFT + m->first * sx, y0 - (double)(m->offset + m->bytes) * sy,
            (m->last - m->first + 1) * sx, hh < 0.5 ? 0.5 : hh);
    colour(f, b, b >= nvalues);
    fprintf(f, "\" stroke=\"#333\" stroke-width=\"0.4\"><title>");
    xml_text(f, m->name);
    fprintf(f, ": %zu bytes at offset %zu, steps %d-%d (", m->bytes, m->offset, m->first, m->last);
    if (m->first < cg->nsteps) xml_text(f, cg->step_names[m->first]);
    if (m->last != m->first && m->last < cg->nsteps) {
      fputs(" to ", f);
      xml_text(f, cg->step_names[m->last]);
    }
    fputs(")", f);
    if (m->inplace_of >= 0) {
      fputs(", in place of ", f);
      xml_text(f, cg->membufs[m->inplace_of].name);
    }
    fputs("</title></rect>\n", f);
  }
  /* bytes alive per step: an in-place buffer shares its first step */
  size_t *alive = calloc((size_t)nsteps + 1, sizeof *alive);
  if (!alive) abort();
  for (int b = 0; b < cg->nmembufs; b++) {
    const kl_membuf *m = &cg->membufs[b];
    for (int s = m->first + (m->inplace_of >= 0); s <= m->last && s < nsteps; s++)
      if (s >= 0) alive[s] += aligned(m->bytes);
  }
  fprintf(f, "<polyline fill=\"none\" stroke=\"#c00\" stroke-width=\"1.5\" points=\"");
  for (int s = 0; s < nsteps; s++)
    fprintf(f, "%.2f,%.2f %.2f,%.2f ", LEFT + s * sx, y0 - (double)alive[s] * sy, LEFT + (s + 1) * sx,
            y0 - (double)alive[s] * sy);
  fprintf(f, "\"/>\n");
  free(alive);
  /* axes: steps below, offsets at the left */
  int xticks = nsteps < 10 ? nsteps : 10;
  for (int t = 0; t <= xticks; t++) {
    int s = (int)((long long)nsteps * t / (xticks ? xticks : 1));
    fprintf(f, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", LEFT + s * sx, y0 + 16, s);
  }
  for (int t = 0; t <= 5; t++) {
    size_t off = (size_t)(top * t / 5);
    fprintf(f, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%zu</text>\n", LEFT - 6,
            y0 - (double)off * sy + 4, off);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">schedule step</text>\n",
          LEFT + PLOT_W / 2, h - 12);
  fprintf(f, "<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" text-anchor=\"middle\">arena "
             "offset (bytes)</text>\n", TOP + PLOT_H / 2, TOP + PLOT_H / 2);
  fprintf(f, "</svg>\n");
  if (ferror(f) | fclose(f)) {
    fprintf(stderr, "kiln: error: writing %s failed\n", path);
    return -1;
  }
  return 0;
}
