// Includes sentencepiece's headers next to Abseil's.
//
// sentencepiece 0.1.97 declares `namespace absl { using std::string_view; }`, which
// clashes with Debian's Abseil (built with its own absl::string_view class). Renaming
// that namespace while its headers are parsed keeps their declarations on
// std::string_view, the type the library was built with, so the ABI still matches.
#pragma once

#define absl conveyor_sentencepiece_absl
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#undef absl
