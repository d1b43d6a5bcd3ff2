// tiles.cuh: tile shapes that no source includes any more.  EXPECT: KD003
#pragma once

constexpr int kTileRows = 64;
