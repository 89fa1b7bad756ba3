// The check of a grouped GEMM's tactic (mb_gemm_tactic) against the entry point that is asked to run it.
// The library runs exactly the tactic it is given and chooses none; this is where one it cannot run is
// refused, before anything is launched: enum values outside their enums, a tile of another kernel, a
// launch or L2 policy the kernel or epilogue does not have (MB_ERR_INVALID_ARGUMENT), and a kernel the
// entry point does not have (MB_ERR_UNSUPPORTED). Which weight layouts a kernel reads is checked where the
// kernel is launched (gemm/sm90_abi.cu, gemm/sm90_dispatch.cuh).
#pragma once

#include "common/common.cuh"
#include "gemm/mma.cuh"  // EpilogueKind
#include "moe_build_kernels.h"

namespace mbk {

constexpr int kLastTile = MB_TILE_DECODE_STAGED_C4;  // the last mb_gemm_tile

// The tile's name in the planner's spelling (moe_build/planner/tactics/tactic.py), for messages.
inline const char* tile_name(int tile) {
  switch (tile) {
    case MB_TILE_NONE: return "none";
    case MB_TILE_MMA_16x64: return "16x64";
    case MB_TILE_MMA_64x128: return "64x128";
    case MB_TILE_MMA_128x128: return "128x128";
    case MB_TILE_COOP_128x256: return "coop128x256";
    case MB_TILE_PINGPONG_64x256: return "pingpong64x256";
    case MB_TILE_PINGPONG_64x128: return "pingpong64x128";
    case MB_TILE_PINGPONG_64x256_C2: return "pingpong64x256c2";
    case MB_TILE_PINGPONG_64x192_C2: return "pingpong64x192c2";
    case MB_TILE_COOP_128x128: return "coop128x128";
    case MB_TILE_COOP_128x128_C2: return "coop128x128c2";
    case MB_TILE_COOP_128x192: return "coop128x192";
    case MB_TILE_COOP_128x192_C2: return "coop128x192c2";
    case MB_TILE_WOQ_128x64: return "woq128x64";
    case MB_TILE_WOQ_128x128: return "woq128x128";
    case MB_TILE_WOQ_128x16: return "woq128x16";
    case MB_TILE_WOQ_128x32: return "woq128x32";
    case MB_TILE_WOQ_128x256: return "woq128x256";
    case MB_TILE_WOQ_128x320_C2: return "woq128x320c2";
    case MB_TILE_WOQ_128x160: return "woq128x160";
    case MB_TILE_WOQ_128x192: return "woq128x192";
    case MB_TILE_WOQ_128x224: return "woq128x224";
    case MB_TILE_DECODE_STAGED: return "staged";
    case MB_TILE_DECODE_STAGED_C4: return "stagedc4";
    case MB_TILE_PINGPONG_64x128_C2: return "pingpong64x128c2";
    case MB_TILE_PINGPONG_128x128: return "pingpong128x128";
    case MB_TILE_PINGPONG_128x128_C2: return "pingpong128x128c2";
    case MB_TILE_DECODE_DIGITS: return "digits";
    case MB_TILE_DECODE_TWOCTA: return "twocta";
    default: return "?";
  }
}

inline const char* kernel_name(int kernel) {
  switch (kernel) {
    case MB_GEMM_DECODE: return "decode";
    case MB_GEMM_MMA: return "mma";
    case MB_GEMM_WGMMA: return "wgmma";
    default: return "?";
  }
}

inline const char* epilogue_name(int epilogue) {
  return epilogue == EPI_GATED ? "gated" : epilogue == EPI_FINALIZE ? "finalize" : "store";
}

inline bool tile_of_kernel(int kernel, int tile) {
  switch (kernel) {
    case MB_GEMM_DECODE: return tile == MB_TILE_NONE || tile == MB_TILE_DECODE_TWOCTA;  // twocta: check_tactic's site
    case MB_GEMM_MMA: return tile >= MB_TILE_MMA_16x64 && tile <= MB_TILE_MMA_128x128;
    default:  // wgmma
      return tile >= MB_TILE_COOP_128x256 && tile <= kLastTile && tile != MB_TILE_DECODE_STAGED &&
             tile != MB_TILE_DECODE_STAGED_C4 && tile != MB_TILE_DECODE_DIGITS && tile != MB_TILE_DECODE_TWOCTA;
  }
}

// What a tactic is checked against: the entry point (its name for messages, and whether it is an sm90
// one, the only entry points with the wgmma kernel), its epilogue, the caller's placement region and whether it has
// the two-CTA decode kernel (the FP8 GEMM with block-128 scales).
struct TacticSite {
  const char* who;
  bool sm90;
  int epilogue;  // EpilogueKind
  const int32_t* placement;
  bool twocta_decode = false;
};

inline mb_status check_tactic(const mb_gemm_tactic& t, const TacticSite& site) {
  const char* who = site.who;
  if (t.kernel < MB_GEMM_DECODE || t.kernel > MB_GEMM_WGMMA)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: tactic kernel %d is not decode (%d), mma (%d) or wgmma (%d)", who,
                t.kernel, MB_GEMM_DECODE, MB_GEMM_MMA, MB_GEMM_WGMMA);
  if (t.tile < MB_TILE_NONE || t.tile > kLastTile)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: tactic tile %d is not an mb_gemm_tile (%d to %d)", who, t.tile,
                MB_TILE_NONE, kLastTile);
  if (t.launch < MB_LAUNCH_PLAIN || t.launch > MB_LAUNCH_PLACED)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: tactic launch %d is not plain (%d), after_trigger (%d) or placed (%d)",
                who, t.launch, MB_LAUNCH_PLAIN, MB_LAUNCH_AFTER_TRIGGER, MB_LAUNCH_PLACED);
  if (t.output_l2 != MB_OUTPUT_L2_PLAIN && t.output_l2 != MB_OUTPUT_L2_EVICT_LAST)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: tactic output_l2 %d is not plain (%d) or evict_last (%d)", who,
                t.output_l2, MB_OUTPUT_L2_PLAIN, MB_OUTPUT_L2_EVICT_LAST);
  const char* kernel = kernel_name(t.kernel);
  if (t.kernel == MB_GEMM_DECODE && (t.tile == MB_TILE_DECODE_STAGED || t.tile == MB_TILE_DECODE_STAGED_C4 ||
                                     t.tile == MB_TILE_DECODE_DIGITS))
    return fail(MB_ERR_UNSUPPORTED, "%s: the %s decode kernel is the weight-only GEMM's (mb_grouped_gemm_woq)", who,
                tile_name(t.tile));
  if (t.kernel == MB_GEMM_DECODE && t.tile == MB_TILE_DECODE_TWOCTA && !site.twocta_decode)
    return fail(MB_ERR_UNSUPPORTED, "%s: the twocta decode kernel is the FP8 GEMM's with block128 scales", who);
  if (!tile_of_kernel(t.kernel, t.tile))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: tile %s is not a tile of the %s kernel", who, tile_name(t.tile),
                kernel);
  if (t.kernel == MB_GEMM_DECODE && t.k_split != 1 && t.k_split != 2 && t.k_split != 4 && t.k_split != 8)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: the decode kernel's k_split %d is not 1, 2, 4 or 8", who, t.k_split);
  if (t.kernel != MB_GEMM_DECODE && t.k_split != 0)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: k_split %d given to the %s kernel (decode only; 0 here)", who,
                t.k_split, kernel);
  if (t.kernel == MB_GEMM_MMA && t.launch != MB_LAUNCH_PLAIN)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: the mma kernel launches plainly only (tactic launch %d)", who,
                t.launch);
  const bool placed_tile = t.tile == MB_TILE_PINGPONG_64x256 || t.tile == MB_TILE_PINGPONG_64x128;
  if (t.launch == MB_LAUNCH_PLACED && !(t.kernel == MB_GEMM_WGMMA && placed_tile && site.epilogue != EPI_STORE))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: a placed launch needs the wgmma kernel on tile pingpong64x256 or "
                "pingpong64x128 with the gated or finalize epilogue (not %s %s, %s epilogue)", who, kernel,
                tile_name(t.tile), epilogue_name(site.epilogue));
  if (t.launch == MB_LAUNCH_PLACED && site.placement == nullptr)
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: a placed launch needs a placement region (placement is NULL)", who);
  if (t.output_l2 == MB_OUTPUT_L2_EVICT_LAST && !(t.kernel == MB_GEMM_WGMMA && site.epilogue != EPI_STORE))
    return fail(MB_ERR_INVALID_ARGUMENT, "%s: evict_last outputs are the wgmma gated and finalize epilogues' only "
                "(not the %s kernel's %s epilogue)", who, kernel, epilogue_name(site.epilogue));
  if (t.kernel == MB_GEMM_WGMMA && !site.sm90)
    return fail(MB_ERR_UNSUPPORTED, "%s: the wgmma kernel runs in the sm90 entry points only", who);
  return MB_OK;
}

}  // namespace mbk
